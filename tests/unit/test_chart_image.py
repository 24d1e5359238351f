"""The operator image (Dockerfile) fits the chart's Deployment: multi-stage, `.[operator]` only, numeric
non-root user equal to the pod's runAsUser, `kopf run` entrypoint whose arguments the chart supplies."""

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
INSTRUCTIONS = [line.strip() for line in DOCKERFILE.splitlines() if line.strip() and not line.startswith("#")]


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
    installs = [r for r in instruction("RUN") if "pip install" in r]
    assert installs and all('".[operator]"' in r for r in installs)
    assert "trainer" not in " ".join(installs) and "dev" not in " ".join(installs)
    assert any(c.startswith("--from=build") for c in instruction("COPY"))


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
    chart_args = deployment()["spec"]["template"]["spec"]["containers"][0]["args"]
    assert chart_args[-2:] == ["-m", "rtj.handlers"]
