"""One torch, the shipped image's: pyproject.toml pins its minor once; the trainer Dockerfile keeps an
NGC base's own build only if it is that minor (hack/pyproject_requirements.py --keep-installed), and
the environment running these tests has it."""

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
SCRIPT = ROOT / "hack" / "pyproject_requirements.py"
sys.path.insert(0, str(SCRIPT.parent))
import pyproject_requirements as reqs  # noqa: E402  (hack/ is no package: the image runs it as a file)


def _pin() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pins = [r for group in extras.values() for r in group if reqs.requirement_name(r) == "torch"]
    assert len(pins) == 1, f"exactly one torch requirement expected, got {pins}"
    return pins[0]


def test_torch_is_pinned_once_to_a_minor() -> None:
    assert re.fullmatch(r"torch==\d+\.\d+\.\*", _pin()), _pin()


def test_the_tests_run_the_pinned_minor() -> None:
    prefix = reqs.release_prefix(_pin())
    assert prefix is not None
    installed = importlib.metadata.version("torch")
    assert reqs.has_release(installed, prefix), f"torch {installed} here, {_pin()} pinned: `make venv`"


def test_the_dockerfile_keeps_the_base_torch_only_through_the_check() -> None:
    dockerfile = (ROOT / "trainer-image" / "Dockerfile").read_text()
    assert "--extra trainer --keep-installed torch" in dockerfile
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile, re.M)
    assert base is not None and base.group(1).startswith("nvcr.io/nvidia/pytorch:"), base


@pytest.mark.parametrize(
    ("version", "prefix", "expected"),
    [
        ("2.11.0a0+b4e4ee81d3", "2.11", True),  # NGC's pre-release build
        ("2.11.0+cu130", "2.11", True),  # PyPI's
        ("2.11.2", "2.11", True),
        ("2.1.0", "2.11", False),
        ("2.10.0a0+abc", "2.11", False),
        ("2.110.0", "2.11", False),
    ],
)
def test_a_version_is_of_a_release_by_its_numeric_parts(version: str, prefix: str, expected: bool) -> None:
    assert reqs.has_release(version, prefix) is expected


def _run(pyproject: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), "--pyproject", str(pyproject), "--extra", "trainer", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _pyproject(tmp_path: Path, torch_requirement: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text(
        '[project]\nname = "x"\ndependencies = []\n'
        f'[project.optional-dependencies]\ntrainer = ["{torch_requirement}", "numpy>=1.26"]\n'
    )
    return path


def test_an_installed_torch_of_the_pinned_minor_is_kept(tmp_path: Path) -> None:
    installed = importlib.metadata.version("torch")
    minor = ".".join(installed.split(".")[:2])
    done = _run(_pyproject(tmp_path, f"torch=={minor}.*"), "--keep-installed", "torch")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["numpy>=1.26"]
    # Without the option the pin stays (a plain Python base installs it from PyPI).
    assert _run(_pyproject(tmp_path, f"torch=={minor}.*")).stdout.split() == [
        f"torch=={minor}.*",
        "numpy>=1.26",
    ]


def test_an_installed_torch_of_another_minor_stops_the_build_naming_both(tmp_path: Path) -> None:
    installed = importlib.metadata.version("torch")
    done = _run(_pyproject(tmp_path, "torch==1.0.*"), "--keep-installed", "torch")
    assert done.returncode == 1 and not done.stdout
    assert installed in done.stderr and "torch==1.0.*" in done.stderr, done.stderr


def test_keep_installed_needs_a_minor_pin(tmp_path: Path) -> None:
    done = _run(_pyproject(tmp_path, "torch>=2.4"), "--keep-installed", "torch")
    assert done.returncode == 1 and "torch==X.Y.*" in done.stderr, done.stderr
