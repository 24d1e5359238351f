"""docs/architecture.md's layout tree names every module of the operator, the trainer runtime and the
local tools, once, and nothing that does not exist (issue 17: the tree shows the layout)."""

from __future__ import annotations

import re

import pytest
from rtj.api import crdgen

pytestmark = pytest.mark.unit

ROOT = crdgen.REPO_ROOT
PACKAGES = ("operator/rtj", "trainer-image/rtj_trainer", "hack/rtj_local")


def tree_modules() -> list[str]:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    (block,) = re.findall(r"## Layout.*?```\n(.*?)```", doc, re.S)
    modules, package = [], ""
    for line in block.splitlines():
        name = line.split()[0]
        if not line.startswith(" "):
            package = name.rstrip("/")
        else:
            modules.append(f"{package}/{name}")
    return modules


def test_the_tree_lists_every_module_once_and_only_modules_that_exist() -> None:
    listed = tree_modules()
    assert len(listed) == len(set(listed)), "a module listed twice"
    present = {
        str(path.relative_to(ROOT))
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    }
    assert sorted(present - set(listed)) == [], "modules missing from docs/architecture.md's tree"
    assert sorted(set(listed) - present) == [], "the tree names modules that do not exist"
