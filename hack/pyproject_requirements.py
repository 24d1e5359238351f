"""Prints requirement lines read from pyproject.toml, one per line, for the image builds.

The Dockerfiles install dependencies from these pins before they copy our code, so that editing the code
reuses the dependency layers (torch, NVRx) instead of reinstalling them. Standard library only: it runs
in the bare base image before anything is installed.

    python pyproject_requirements.py [--pyproject PATH] [--build-system] [--extra NAME]... [--only NAME]
                                     [--keep-installed NAME]

`--keep-installed torch` is for a base image that brings its own build of a pinned distribution (NGC's
torch, built against its CUDA and NCCL): that requirement is left out, after checking that the
installed version has the pin's release (`torch==2.11.*` accepts NGC's `2.11.0a0+…`); a base with
another release stops the build with both versions named. Without it installed, the pin is kept.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path


def requirement_name(requirement: str) -> str:
    """The distribution name of a PEP 508 requirement, normalized (PEP 503)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: dict, *, build_system: bool, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    lines = list(pyproject["build-system"]["requires"]) if build_system else []
    lines += project.get("dependencies", [])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise KeyError(f"pyproject.toml has no optional-dependencies group {extra!r}")
        lines += optional[extra]
    return list(dict.fromkeys(lines))


def release_prefix(requirement: str) -> str | None:
    """The release a `NAME==X.Y.*` pin asks for ("X.Y"); None for any other kind of requirement."""
    match = re.fullmatch(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*==\s*(\d+(?:\.\d+)*)\.\*\s*", requirement)
    return match.group(1) if match else None


def has_release(version: str, prefix: str) -> bool:
    """Whether `version` (pre-release or local parts ignored: NGC's 2.11.0a0+abc) is of release `prefix`."""
    release = re.match(r"\d+(?:\.\d+)*", version)
    parts = release.group(0).split(".") if release else []
    wanted = prefix.split(".")
    return parts[: len(wanted)] == wanted


def keep_installed(lines: list[str], name: str) -> tuple[list[str], str | None]:
    """`lines` without the requirement of `name` when `name` is installed with the pin's release;
    else `lines` unchanged. The error names both versions when the installed one is another release."""
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return lines, None
    pins = [line for line in lines if requirement_name(line) == requirement_name(name)]
    prefixes = [release_prefix(pin) for pin in pins]
    if len(pins) != 1 or prefixes[0] is None:
        return lines, f"--keep-installed {name}: expected one {name}==X.Y.* pin, found {pins}"
    if not has_release(installed, prefixes[0]):
        return (
            lines,
            f"the base image has {name} {installed}; pyproject.toml pins {pins[0]}: "
            f"use a base with {name} {prefixes[0]}",
        )
    return [line for line in lines if line not in pins], None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--build-system", action="store_true", help="include [build-system] requires")
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group")
    parser.add_argument("--only", help="only the pin of this distribution (any group)")
    parser.add_argument(
        "--keep-installed", help="leave out this pin if installed with its release (see above)"
    )
    args = parser.parse_args(argv)
    pyproject = tomllib.loads(args.pyproject.read_text())
    if args.only:
        every_extra = list(pyproject["project"].get("optional-dependencies", {}))
        lines = requirements(pyproject, build_system=True, extras=every_extra)
        lines = [line for line in lines if requirement_name(line) == requirement_name(args.only)]
        if len(lines) != 1:
            print(f"expected one requirement of {args.only!r}, found {lines}", file=sys.stderr)
            return 1
    else:
        lines = requirements(pyproject, build_system=args.build_system, extras=args.extra)
    if args.keep_installed:
        lines, error = keep_installed(lines, args.keep_installed)
        if error:
            print(error, file=sys.stderr)
            return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
