"""One NVRx, the one we ship: pyproject.toml pins it; the Makefile's venv, the trainer Dockerfile and
the environment running these tests must all agree with that pin."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _pinned() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [r for reqs in extras.values() for r in reqs if r.startswith("nvidia-resiliency-ext")]
    assert len(pins) == 1, f"exactly one NVRx requirement expected, got {pins}"
    match = re.fullmatch(r"nvidia-resiliency-ext==(\d+\.\d+\.\d+)", pins[0])
    assert match, f"NVRx must be pinned exactly (==X.Y.Z), got {pins[0]!r}"
    return match.group(1)


def test_the_pin_is_a_07_release() -> None:
    assert _pinned().startswith("0.7."), "the image ships NVRx 0.7.x; move the pin with the image"


def test_the_trainer_dockerfile_installs_the_pinned_nvrx() -> None:
    # The image reads the pin from pyproject.toml itself (hack/pyproject_requirements.py): no second pin.
    dockerfile = (ROOT / "trainer-image" / "Dockerfile").read_text()
    assert "NVRX_VERSION" not in dockerfile
    assert "pyproject_requirements.py --only nvidia-resiliency-ext" in dockerfile
    script, pyproject = ROOT / "hack" / "pyproject_requirements.py", ROOT / "pyproject.toml"
    cmd = [sys.executable, str(script), "--pyproject", str(pyproject), "--only", "nvidia-resiliency-ext"]
    pin = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    assert pin == f"nvidia-resiliency-ext=={_pinned()}"


def test_the_makefile_installs_the_pinned_nvrx() -> None:
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f'"nvidia-resiliency-ext=={_pinned()}"' in dry_run


def test_the_tests_run_the_pinned_nvrx() -> None:
    assert importlib.metadata.version("nvidia-resiliency-ext") == _pinned()
