"""The trainer image (trainer-image/Dockerfile): one Dockerfile for the GPU image and the CPU variant,
dependency layers before the code, NVRx from pyproject.toml's one pin, a verified EFA installer and a
non-root user that does not clash with Ubuntu 24.04's UID 1000."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile

import pytest
from rtj.api import crdgen
from rtj_trainer import runtime_env

pytestmark = pytest.mark.unit

ROOT = crdgen.REPO_ROOT
DOCKERFILE = (ROOT / "trainer-image" / "Dockerfile").read_text()


def _instructions(text: str) -> list[str]:
    """One entry per instruction, its continuation lines joined; comments dropped."""
    lines = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [" ".join(p.strip() for p in b.split("\\\n")) for b in re.split(r"(?<!\\)\n", lines) if b.strip()]


INSTRUCTIONS = _instructions(DOCKERFILE)


def first(prefix: str) -> int:
    return next(i for i, ins in enumerate(INSTRUCTIONS) if ins.startswith(prefix))


def test_dependencies_are_installed_before_the_code_is_copied() -> None:
    deps = first("RUN python -m pip install --only-binary=:all:")
    code = first("RUN python -m pip install --no-deps")
    assert deps < first("COPY operator/") < code
    assert deps < first("COPY trainer-image/rtj_trainer/") < code
    assert "--extra trainer" in INSTRUCTIONS[deps]
    assert not any("rtj_local" in ins or ins.startswith("COPY hack/ ") for ins in INSTRUCTIONS)


def test_nvrx_comes_from_the_pyproject_pin_with_the_platform_options() -> None:
    deps = INSTRUCTIONS[first("RUN python -m pip install --only-binary=:all:")]
    assert "--platform manylinux_2_39_x86_64" in deps and "--no-deps" in deps
    assert "--only nvidia-resiliency-ext" in deps
    assert "NVRX_VERSION" not in DOCKERFILE  # no second pin to drift from pyproject.toml
    script = ROOT / "hack" / "pyproject_requirements.py"
    cmd = [
        sys.executable,
        str(script),
        "--pyproject",
        str(ROOT / "pyproject.toml"),
        "--only",
        "nvidia-resiliency-ext",
    ]
    pin = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    assert re.fullmatch(r"nvidia-resiliency-ext==\d+\.\d+\.\d+", pin)


def test_efa_installer_is_checksum_verified_and_optional() -> None:
    efa = INSTRUCTIONS[first('RUN if [ "$WITH_EFA" = 1 ]')]
    assert "sha256sum -c -" in efa
    assert efa.index("sha256sum -c -") < efa.index("efa_installer.sh")
    assert "ARG EFA_INSTALLER_SHA256=" in INSTRUCTIONS
    assert "ARG WITH_EFA=1" in INSTRUCTIONS  # the default is the GPU image


def test_runs_as_a_numeric_non_root_user_other_than_ubuntus() -> None:
    (user,) = [ins.split()[1] for ins in INSTRUCTIONS if ins.startswith("USER ")]
    uid, gid = (int(x) for x in user.split(":"))
    assert uid not in (0, 1000) and gid not in (0, 1000)
    assert f"--uid {uid}" in DOCKERFILE and f"--gid {gid}" in DOCKERFILE


def test_the_installed_package_has_the_autoreport_bootstrap(tmp_path) -> None:
    """The image installs the project non-editable (`pip install .`) from what it copies: the wheel
    must carry the sitecustomize the entrypoint puts on the ranks' PYTHONPATH, or a plain script
    reports no step. Built from a copy of exactly those sources (a checkout's egg-info would list it)."""
    src, skip = tmp_path / "src", shutil.ignore_patterns("__pycache__", "*.egg-info")
    for part in ("operator", "trainer-image/rtj_trainer"):
        shutil.copytree(ROOT / part, src / part, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*wheel_cmd, "-w", str(tmp_path), str(src)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("*.whl")
    site = runtime_env.AUTOREPORT_BOOTSTRAP_DIR.split("rtj_trainer/", 1)[1]
    assert f"rtj_trainer/{site}/sitecustomize.py" in zipfile.ZipFile(wheel).namelist()
