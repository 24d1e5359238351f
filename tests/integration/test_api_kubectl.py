"""What a user sees with kubectl: `kubectl explain` prints the models' descriptions, `kubectl apply` of the
example works with strict validation, and `kubectl get rtj` shows the printer columns."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from rtj.api.models import FaultTolerance, JobSpec
from rtj_local.wait import wait_for

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "h100-4node.yaml"


def explain(kubectl, path: str) -> str:
    # The API server publishes a new CRD's OpenAPI a moment after it is Established.
    def attempt() -> str | None:
        result = kubectl("explain", path, check=False)
        return result.stdout if result.returncode == 0 else None

    return wait_for(attempt, timeout=30, interval=0.5, message=f"kubectl explain {path}")


def test_explain_spec_prints_the_model_descriptions(rtj_chart, kubectl) -> None:
    out = explain(kubectl, "rtj.spec")
    print(out)  # shown with -s; quoted in the report
    assert re.search(r"KIND:\s+ResilientTrainingJob", out)
    flat = " ".join(out.split())
    for field in JobSpec.model_fields.values():
        assert " ".join(field.description.split()) in flat, field.description


def test_explain_fault_tolerance_prints_each_budget(rtj_chart, kubectl) -> None:
    out = explain(kubectl, "rtj.spec.faultTolerance")
    flat = " ".join(out.split())
    for field in FaultTolerance.model_fields.values():
        assert " ".join(field.description.split()) in flat, field.description


def test_explain_shows_defaults_and_bounds(rtj_chart, kubectl) -> None:
    flat = " ".join(explain(kubectl, "rtj.spec.faultTolerance.heartbeatTimeoutSeconds").split())
    assert "Default: 60. Minimum: 2, maximum: 3600." in flat, flat
    flat = " ".join(explain(kubectl, "rtj.spec.podTemplate.securityContext.fsGroup").split())
    assert "Default: 10001. Minimum: 0, maximum: 2147483647." in flat, flat


def test_apply_example_and_get_shows_the_printer_columns(rtj_chart, kubectl, rtj_api, namespace: str) -> None:
    applied = kubectl("apply", "--server-side", "--validate=strict", "-n", namespace, "-f", str(EXAMPLE))
    assert "llama-fsdp-4node serverside-applied" in applied.stdout
    checkpoint_time = (datetime.now(UTC) - timedelta(minutes=3)).replace(microsecond=0)
    rtj_api.patch_status(
        namespace,
        "llama-fsdp-4node",
        {
            "status": {
                "state": "Running",
                "reason": "AllPodsRunning",
                "nodesDesired": 4,
                "nodesReady": 4,
                "restarts": {"inProcess": 3, "inJob": 1, "podReschedules": 1},
                "lastCheckpoint": {"step": 1200, "time": checkpoint_time.isoformat().replace("+00:00", "Z")},
            }
        },
    )
    out = kubectl("get", "rtj", "-n", namespace).stdout
    print(out)
    header, row = out.strip().splitlines()
    columns = "NAME READY DESIRED STATE REASON IN-PROC IN-JOB RESCHED CKPT-STEP CKPT-AGE AGE"
    assert header.split() == columns.split()
    cells = row.split()
    assert cells[:9] == ["llama-fsdp-4node", "4", "4", "Running", "AllPodsRunning", "3", "1", "1", "1200"]
    assert re.fullmatch(r"3m(\d+s)?|2m5\ds", cells[9]), cells[9]  # a date column: age of the checkpoint


def test_wide_output_adds_step_rate_and_the_newest_fault(rtj_chart, kubectl, rtj_api, namespace: str) -> None:
    kubectl("apply", "--server-side", "--validate=strict", "-n", namespace, "-f", str(EXAMPLE))
    now = datetime.now(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    rtj_api.patch_status(
        namespace,
        "llama-fsdp-4node",
        {
            "status": {
                "state": "Recovering",
                "reason": "HeartbeatTimeout",
                "restarts": {"inProcess": 0, "inJob": 0, "podReschedules": 0, "job": 2},
                "step": 1234,
                "stepsPerSecond": 4.25,
                "memorySnapshotStep": 1230,
                "replicaStep": 1228,
                "lastFault": {"reason": "HeartbeatTimeout", "slot": 2, "node": "ip-10-0-1-7", "time": now},
            }
        },
    )
    out = kubectl("get", "rtj", "-n", namespace, "-o", "wide").stdout
    print(out)
    header, row = out.strip().splitlines()
    assert header.split()[-8:] == [
        "JOB-RST", "STEP", "STEPS/S", "MEM-STEP", "REPLICA-STEP", "LAST-FAULT", "FAULT-NODE", "FAULT-AGE",
    ]  # fmt: skip
    assert row.split()[-8:-1] == ["2", "1234", "4.25", "1230", "1228", "HeartbeatTimeout", "ip-10-0-1-7"]


def test_apply_with_a_typo_names_the_field(rtj_chart, kubectl, namespace: str, tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(EXAMPLE.read_text().replace("  nodes: 4", "  node: 4"))
    result = kubectl(
        "apply", "--server-side", "--validate=strict", "-n", namespace, "-f", str(bad), check=False
    )
    assert result.returncode != 0
    # Server-side apply reports unknown fields itself, naming the path.
    assert ".spec.node: field not declared in schema" in result.stderr, result.stderr
