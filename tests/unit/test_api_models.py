"""The pydantic models (what the operator parses every object with) agree with the examples and reject
what the CRD rejects where pydantic can see it (CEL-only rules are covered by the integration tests)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from rtj.api.models import JobSpec, ResilientTrainingJob

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example_jobs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        out += [
            (path.name, d)
            for d in yaml.safe_load_all(path.read_text())
            if d["kind"] == "ResilientTrainingJob"
        ]
    return out


@pytest.mark.parametrize("name,obj", example_jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_examples_parse(name: str, obj: dict[str, Any]) -> None:
    job = ResilientTrainingJob.model_validate(obj)
    assert job.spec.nodes >= 1 and job.spec.procs >= 1


def test_h100_example_is_ten_lines_with_fsx() -> None:
    text = (EXAMPLES / "h100-4node.yaml").read_text()
    assert len(text.splitlines()) == 10
    spec = JobSpec.model_validate(yaml.safe_load(text)["spec"])
    assert spec.nodes == 4 and spec.gpus_per_node == 8 and spec.resources.efa_per_node == 32
    assert spec.checkpoint.fsx is not None and spec.checkpoint.pvc is None


def test_local_demo_is_cpu_only() -> None:
    (obj,) = [d for n, d in example_jobs() if n == "local-cpu-demo.yaml"]
    spec = JobSpec.model_validate(obj["spec"])
    assert (spec.nodes, spec.procs, spec.gpus_per_node, spec.resources.efa_per_node) == (2, 2, 0, 0)
    assert spec.checkpoint.pvc is not None
    assert spec.command == ["python", "-m", "rtj_trainer.examples.fsdp_train"]


BASE = {"image": "img", "command": ["python"], "nodes": 2, "checkpoint": {"pvc": {"claimName": "ckpt"}}}


def with_(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    *parents, leaf = path.split(".")
    node = spec
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return spec


@pytest.mark.parametrize(
    "spec,field",
    [
        (with_("nodes", 0), "nodes"),
        (with_("gpusPerNode", 9), "gpusPerNode"),
        (with_("faultTolerance.maxPodReschedules", -1), "maxPodReschedules"),
        (with_("bogus", 1), "bogus"),
        (with_("faultTolerance.bogus", 1), "bogus"),
        (
            with_("checkpoint.fsx", {"fileSystemId": "fs-XYZ", "dnsName": "a.b", "mountName": "m"}),
            "fileSystemId",
        ),
        (with_("resources.memory", "12XB"), "memory"),
        (with_("placement.tolerations", [{"effect": "Sometimes"}]), "effect"),
        (with_("command", []), "command"),
        (with_("env", [{"name": "1BAD NAME"}]), "name"),
        (with_("resources.efaPerNode", 33), "efaPerNode"),
        (with_("resources.cpu", -1), "cpu"),
        (with_("podTemplate.volumes", [{"emptyDir": {}}]), "volumes"),
        (with_("podTemplate.volumes", [{"name": "", "emptyDir": {}}]), "volumes"),
        (with_("faultTolerance.hangDetection", {"floorSeconds": 0}), "floorSeconds"),
        (with_("faultTolerance.hangDetection", {"medianMultiple": 1}), "medianMultiple"),
    ],
)
def test_pydantic_rejects_invalid_specs_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(spec)
    assert field in str(err.value)


def test_quantities_accept_integers() -> None:
    spec = JobSpec.model_validate(with_("resources.cpu", 180))
    assert spec.resources.cpu == "180"


def test_status_ignores_unknown_fields_and_defaults() -> None:
    job = ResilientTrainingJob.model_validate(
        {"apiVersion": "x", "kind": "y", "spec": BASE, "status": {"state": "Running", "futureField": 1}}
    )
    assert job.status.state == "Running" and job.status.restarts.pod_reschedules == 0
