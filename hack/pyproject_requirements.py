"""Prints requirement lines read from pyproject.toml, one per line, for the image builds.

The Dockerfiles install dependencies from these pins before they copy our code, so that editing the code
reuses the dependency layers (torch, NVRx) instead of reinstalling them. Standard library only: it runs
in the bare base image before anything is installed.

    python pyproject_requirements.py [--pyproject PATH] [--build-system] [--extra NAME]... [--only NAME]
"""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--build-system", action="store_true", help="include [build-system] requires")
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependencies group")
    parser.add_argument("--only", help="only the pin of this distribution (any group)")
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
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
