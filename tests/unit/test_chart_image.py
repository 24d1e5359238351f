"""The operator image (Dockerfile) fits the chart's Deployment: multi-stage, `.[operator]` only (its
dependencies installed before the code is copied), numeric non-root user equal to the pod's runAsUser,
`kopf run` entrypoint whose arguments the chart supplies."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from rtj.api import crdgen
from rtj_local.versions import bin_path

pytestmark = pytest.mark.unit

DOCKERFILE = (crdgen.REPO_ROOT / "Dockerfile").read_text()


def _instructions(text: str) -> list[str]:
    """One entry per instruction, its continuation lines joined; comments dropped."""
    lines = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return [" ".join(p.strip() for p in b.split("\\\n")) for b in re.split(r"(?<!\\)\n", lines) if b.strip()]


INSTRUCTIONS = _instructions(DOCKERFILE)


def instruction(name: str) -> list[str]:
    return [line.split(None, 1)[1] for line in INSTRUCTIONS if line.split(None, 1)[0] == name]


def deployment() -> dict:
    chart = crdgen.REPO_ROOT / "charts" / "resilient-training-operator"
    cmd = [str(bin_path("helm")), "template", "rtj", str(chart)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout
    (dep,) = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment"]
    return dep


def test_multi_stage_build_installs_only_the_operator_extra() -> None:
    assert len(instruction("FROM")) == 2
    runs = instruction("RUN")
    (deps,) = [r for r in runs if "pyproject_requirements.py" in r]
    assert "--extra operator" in deps and "pip install -r requirements.txt" in deps
    assert "trainer" not in deps and "dev" not in deps
    (code,) = [r for r in runs if "pip install --no-deps" in r]
    assert "rtj_local" in code  # the image checks that the hack/ package stayed out
    copies = instruction("COPY")
    # Dependencies come from pyproject.toml alone, before any code: editing the code reuses their layer.
    assert INSTRUCTIONS.index(f"RUN {deps}") < INSTRUCTIONS.index("COPY operator/ operator/")
    assert INSTRUCTIONS.index("COPY operator/ operator/") < INSTRUCTIONS.index(f"RUN {code}")
    assert not any("rtj_local" in c or "trainer-image" in c for c in copies)
    assert any(c.startswith("--from=build") for c in copies)


def test_runs_as_the_numeric_non_root_user_the_chart_expects() -> None:
    (user,) = instruction("USER")
    uid, gid = (int(x) for x in user.split(":"))
    assert uid != 0 and gid != 0
    pod_sc = deployment()["spec"]["template"]["spec"]["securityContext"]
    assert (pod_sc["runAsUser"], pod_sc["runAsGroup"]) == (uid, gid)
    assert "PYTHONDONTWRITEBYTECODE=1" in DOCKERFILE  # read-only root filesystem


def test_entrypoint_is_kopf_run_of_the_handlers_module() -> None:
    (entrypoint,) = instruction("ENTRYPOINT")
    assert json.loads(entrypoint) == ["kopf", "run"]
    (cmd,) = instruction("CMD")
    args = json.loads(cmd)
    assert args[-2:] == ["-m", "rtj.handlers"]
    assert any(re.fullmatch(r"--liveness=http://0\.0\.0\.0:\d+/healthz", a) for a in args)
    assert "--all-namespaces" in args and "--standalone" in args
    # The chart runs `python -m rtj` (the leader election, then this very `kopf run -m rtj.handlers`).
    (container,) = deployment()["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "rtj"] and "--standalone" in container["args"]
    assert "PATH=/opt/venv/bin:$PATH" in DOCKERFILE  # `python` is the venv's, which has rtj and kopf
