"""The committed CRD is what crdgen generates now, and it is a structural schema the API server accepts:
no $ref/title/nullable anyOf, a description on every field, CEL rules where oldSelf exists."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from rtj import contract
from rtj.api import crdgen
from rtj.api.models import FaultTolerance, Resources

pytestmark = pytest.mark.unit

CRD = crdgen.crd()
VERSION = CRD["spec"]["versions"][0]
ROOT = VERSION["schema"]["openAPIV3Schema"]
SPEC = ROOT["properties"]["spec"]
STATUS = ROOT["properties"]["status"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("path", crdgen.OUTPUTS, ids=lambda p: str(p.relative_to(crdgen.REPO_ROOT)))
def test_committed_crd_matches_the_models(path) -> None:
    assert path.read_text() == crdgen.render(), f"{path} drifted from the models: run `make generate`"


def test_check_mode_reports_no_drift() -> None:
    assert crdgen.main(["--check"]) == 0


def test_names_come_from_the_contract() -> None:
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == f"{contract.PLURAL}.{contract.API_GROUP}"
    assert (names["kind"], names["plural"], names["shortNames"]) == (contract.KIND, contract.PLURAL, ["rtj"])
    assert names["categories"]
    assert VERSION["name"] == contract.API_VERSION and VERSION["storage"] and VERSION["served"]
    assert VERSION["subresources"] == {"status": {}}


@pytest.mark.parametrize("path,node", list(walk(ROOT)), ids=lambda v: v if isinstance(v, str) else "")
def test_schema_node_is_structural(path: str, node: dict[str, Any]) -> None:
    assert "$ref" not in node and "title" not in node and "$defs" not in node
    assert "nullable" not in node or node["nullable"] is True
    if "anyOf" in node:  # only the Kubernetes int-or-string spelling
        assert node.get("x-kubernetes-int-or-string") is True
        assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    else:
        assert "type" in node, f"{path}: structural schemas need a type on every node"
    if "properties" in node:
        assert "additionalProperties" not in node, f"{path}: properties and additionalProperties exclude"
    assert not isinstance(node.get("additionalProperties"), bool), path


@pytest.mark.parametrize(
    "path,node",
    [(p, n) for p, n in walk(ROOT) if p and not p.endswith(("[]", "{}")) and p != ".metadata"],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_field_has_a_description(path: str, node: dict[str, Any]) -> None:
    assert node.get("description", "").strip(), f"{path} has no description (kubectl explain prints it)"


def test_immutability_rules_sit_on_the_fields_where_oldself_exists() -> None:
    # Transition rules on required scalar fields of spec: oldSelf is always set on update.
    for field in ("image", "nodes"):
        rules = SPEC["properties"][field]["x-kubernetes-validations"]
        assert {
            "rule": "self == oldSelf",
            "message": f"{field} is immutable; create a new job to change it",
        } in rules
        assert field in SPEC["required"]
    # On spec itself only rules that guard against adding/removing an optional field, or that
    # allow a change only together with suspend, may read oldSelf.
    for rule in SPEC.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            allowed = ("has(self.procsPerNode) == has(oldSelf.", "self.suspend ||")
            assert rule["rule"].startswith(allowed), rule
            assert rule["fieldPath"] in (".procsPerNode", ".command", ".args", ".env")


def test_world_and_storage_fields_are_immutable() -> None:
    """issue 13, case 4: fields that define the training world or where its checkpoints live."""
    assert SPEC["properties"]["gpusPerNode"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    ckpt = SPEC["properties"]["checkpoint"]
    assert ckpt["properties"]["mountPath"]["x-kubernetes-validations"][0]["rule"] == "self == oldSelf"
    paths = {r.get("fieldPath") for r in ckpt["x-kubernetes-validations"] if "oldSelf" in r["rule"]}
    assert paths == {".pvc", ".fsx"}
    spec_paths = {r.get("fieldPath") for r in SPEC["x-kubernetes-validations"] if "oldSelf" in r["rule"]}
    assert spec_paths == {".procsPerNode", ".command", ".args", ".env"}


def test_cross_field_rules_report_the_offending_field() -> None:
    ft = SPEC["properties"]["faultTolerance"]
    assert {r["fieldPath"] for r in ft["x-kubernetes-validations"]} == {
        ".heartbeatTimeoutSeconds",
        ".startupTimeoutSeconds",
    }
    assert SPEC["x-kubernetes-validations"][0]["fieldPath"] == ".procsPerNode"
    ipr = ft["properties"]["inProcessRestart"]
    assert ipr["x-kubernetes-validations"][0]["fieldPath"] == ".hardTimeoutSeconds"


def test_hostpath_volumes_are_refused_by_cel() -> None:
    items = SPEC["properties"]["podTemplate"]["properties"]["volumes"]["items"]
    assert {
        "rule": "!has(self.hostPath)",
        "message": "hostPath volumes are not allowed in podTemplate.volumes",
        "fieldPath": ".hostPath",
    } in (items["x-kubernetes-validations"])
    assert items["x-kubernetes-preserve-unknown-fields"] is True
    # CEL sees only declared properties, never preserved unknown ones: hostPath must be declared.
    assert "hostPath" in items["properties"] and items["required"] == ["name"]


def test_rules_on_lists_are_bounded_for_the_cel_cost_budget() -> None:
    for path, node in walk(SPEC):
        if node.get("type") == "array" and any("x-kubernetes-validations" in n for _, n in walk(node)):
            assert "maxItems" in node, f"{path}: CEL under an unbounded list exceeds the cost budget"


def test_defaults_and_bounds_survive() -> None:
    props = SPEC["properties"]
    assert props["gpusPerNode"]["default"] == 8 and props["gpusPerNode"]["maximum"] == 8
    assert props["nodes"]["minimum"] == 1
    hang = props["faultTolerance"]["properties"]["hangDetection"]["properties"]
    assert hang["floorSeconds"]["minimum"] == 1 and hang["floorSeconds"]["default"] == 5
    assert hang["medianMultiple"]["minimum"] == 2 and hang["medianMultiple"]["default"] == 20
    assert props["resources"]["properties"]["efaPerNode"]["maximum"] == 32
    assert props["placement"]["properties"]["tolerations"]["items"]["properties"]["effect"]["enum"] == [
        "",
        "NoSchedule",
        "PreferNoSchedule",
        "NoExecute",
    ]
    # Spelled-out defaults (the server fills in, and checks against CEL, the effective budgets) that
    # agree with what the operator's models default to.
    ft_default = props["faultTolerance"]["default"]
    assert ft_default == FaultTolerance().model_dump(by_alias=True, exclude={"do_not_restart_exit_codes"})
    assert props["resources"]["default"] == Resources().model_dump(by_alias=True, exclude_none=True)
    assert "default" not in props["checkpoint"]  # required, and {} would fail its exactly-one rule


def test_status_is_typed() -> None:
    assert "x-kubernetes-preserve-unknown-fields" not in STATUS  # typed: unknown fields pruned or rejected
    assert STATUS["properties"]["restarts"]["properties"]["podReschedules"]["type"] == "integer"
    conditions = STATUS["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == [
        "type"
    ]
    assert STATUS["properties"]["lastCheckpoint"]["properties"]["time"]["format"] == "date-time"


def test_printer_columns() -> None:
    cols = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    default = [c["name"] for c in VERSION["additionalPrinterColumns"] if not c.get("priority")]
    assert default == [
        "Ready", "Desired", "State", "Reason", "In-Proc", "In-Job", "Resched", "Ckpt-Step", "Ckpt-Age", "Age",
    ]  # fmt: skip
    # -o wide only (priority 1): what a user asks next about a job in trouble (issue 13, case 8).
    wide = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"] if c.get("priority") == 1}
    assert wide == {
        # issue 13: a lost rendezvous pod or workers failing together (no pod budget spent).
        "Job-Rst": ".status.restarts.job",
        "Step": ".status.step",
        "Steps/s": ".status.stepsPerSecond",
        # issue 14: the newest step a restart resumes from in memory (Ckpt-Step: the newest persisted).
        "Mem-Step": ".status.memorySnapshotStep",
        # issue 14: the newest step a replacement pod resumes from its peer's replica.
        "Replica-Step": ".status.replicaStep",
        "Last-Fault": ".status.lastFault.reason",
        "Fault-Node": ".status.lastFault.node",
        "Fault-Age": ".status.lastFault.time",
    }
    assert cols["Ckpt-Age"] == {
        "name": "Ckpt-Age",
        "type": "date",
        "jsonPath": ".status.lastCheckpoint.time",
        "description": "When the last checkpoint was committed.",
    }
    assert cols["Desired"]["jsonPath"] == ".spec.nodes"
    assert cols["Resched"]["jsonPath"] == ".status.restarts.podReschedules"


def test_rendered_yaml_round_trips() -> None:
    text = crdgen.render()
    assert text.startswith("# Generated by")
    assert yaml.safe_load(text) == CRD


@pytest.mark.parametrize(
    "path,node",
    [(p, n) for p, n in walk(SPEC) if "description" in n],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_spec_field_states_its_default_and_bounds(path: str, node: dict[str, Any]) -> None:
    # kubectl explain shows only the description: it must carry what the schema enforces.
    text = node["description"]
    default = node.get("default")
    if default is not None and not isinstance(default, dict | list):
        assert f"Default: {crdgen._plain(default)}." in text, path
    if "minimum" in node:
        assert f"inimum: {node['minimum']}" in text, path
    if "maximum" in node:
        assert f"aximum: {node['maximum']}" in text, path
    if "maxLength" in node:
        assert f"At most {node['maxLength']} characters." in text, path
    if "maxItems" in node:
        assert f"At most {node['maxItems']} items." in text, path


def test_heartbeat_timeout_is_explained_with_default_and_bounds() -> None:
    node = SPEC["properties"]["faultTolerance"]["properties"]["heartbeatTimeoutSeconds"]
    assert node["description"].endswith("Default: 60. Minimum: 2, maximum: 3600.")


@pytest.mark.parametrize("path", crdgen.OUTPUTS, ids=lambda p: str(p.relative_to(crdgen.REPO_ROOT)))
def test_generated_yaml_passes_yamllint_defaults(path) -> None:
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    # yamllint's default rules, except line-length: patterns and CEL rules cannot be wrapped.
    config = YamlLintConfig("{extends: default, rules: {line-length: disable}}")
    problems = [f"{p.line}:{p.column} {p.message} ({p.rule})" for p in linter.run(path.read_text(), config)]
    assert not problems, problems
    assert "&id" not in path.read_text()  # no YAML anchors: every tool reads the file the same way
