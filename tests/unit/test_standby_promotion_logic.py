"""Hot-spare (standby) logic of the trainer: the heartbeat agent's promotion signal and the
warm launcher's command line. The Lease writer is replaced by a recording fake (pure logic only);
tests/trainer/test_trainer_standby.py runs it against the real API server."""

from __future__ import annotations

import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest
from rtj.contract import ASSIGNED_SLOT_ANNOTATION, HEARTBEAT_ANNOTATION, Heartbeat, PodState, TrainerConfig
from rtj_trainer import heartbeat
from rtj_trainer.entrypoint import build_launcher_argv, launcher_command
from rtj_trainer.heartbeat import HeartbeatAgent, PodIdentity
from rtj_trainer.report import RankReporter
from rtj_trainer.warm_launcher import prewarm_module

pytestmark = pytest.mark.unit


class FakeLeaseStore:
    """Stands in for the API server's Lease: merge-patches the heartbeat annotation in, returns all."""

    def __init__(self) -> None:
        self.annotations: dict[str, str] = {}
        self.written: list[Heartbeat] = []
        self.first_write = threading.Event()

    def write(self, hb: Heartbeat, now: datetime) -> dict[str, str]:
        self.written.append(hb)
        self.first_write.set()
        self.annotations[HEARTBEAT_ANNOTATION] = hb.to_annotation()
        return dict(self.annotations)


def agent_with(store: FakeLeaseStore, status_dir: Path, standby: bool) -> HeartbeatAgent:
    return HeartbeatAgent(
        str(status_dir), PodIdentity("j-spare-0-a0", "ns", None), 5.0, None, standby=standby, writer=store
    )


def test_standby_reports_standby_until_the_slot_annotation_appears(tmp_path: Path) -> None:
    store = FakeLeaseStore()
    agent = agent_with(store, tmp_path, standby=True)
    assert agent.tick().state == PodState.STANDBY
    assert agent.tick().state == PodState.STANDBY
    assert not agent.promoted.is_set() and agent.assigned_slot is None

    store.annotations[ASSIGNED_SLOT_ANNOTATION] = "1"  # the operator promotes it
    agent.tick()  # the renewal that returns the annotation
    assert agent.promoted.is_set() and agent.assigned_slot == "1"
    # From now on it reports what its ranks report: Starting (no rank yet), then Training.
    assert agent.tick().state == PodState.STARTING
    reporter = RankReporter(str(tmp_path), rank=2, local_rank=0, write_interval=0)
    reporter.state(PodState.TRAINING)
    reporter.step(7)
    hb = agent.tick()
    assert hb.state == PodState.TRAINING and hb.step == 7


def test_empty_or_absent_slot_is_not_a_promotion(tmp_path: Path) -> None:
    store = FakeLeaseStore()
    agent = agent_with(store, tmp_path, standby=True)
    store.annotations[ASSIGNED_SLOT_ANNOTATION] = ""
    assert agent.tick().state == PodState.STANDBY
    assert not agent.promoted.is_set()


def test_a_normal_worker_ignores_the_annotation_and_never_reports_standby(tmp_path: Path) -> None:
    store = FakeLeaseStore()
    store.annotations[ASSIGNED_SLOT_ANNOTATION] = "0"
    agent = agent_with(store, tmp_path, standby=False)
    assert agent.tick().state == PodState.STARTING
    assert not agent.promoted.is_set()


def test_standby_renews_often_and_promotion_is_seen_within_a_renewal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's thread renews every STANDBY_RENEW_SECONDS in standby, although the configured
    interval (5 s) is far longer: the promotion is noticed within about one short renewal."""
    monkeypatch.setattr(heartbeat, "STANDBY_RENEW_SECONDS", 0.05)
    store = FakeLeaseStore()
    agent = agent_with(store, tmp_path, standby=True)
    agent.start()
    try:
        assert store.first_write.wait(10.0), "the agent never wrote its Lease"
        assert not agent.promoted.is_set()
        store.annotations[ASSIGNED_SLOT_ANNOTATION] = "0"
        # Well under the configured 5 s interval: only the short standby renewal can see it in time.
        assert agent.promoted.wait(3.0), "promotion not seen although the Lease carries the slot"
        assert len(store.written) >= 2 and store.written[0].state == PodState.STANDBY
    finally:
        agent.stop(None)


def test_prewarm_module_only_for_python_dash_m() -> None:
    assert prewarm_module(["python", "-m", "rtj_trainer.examples.fsdp_train", "--steps", "3"]) == (
        "rtj_trainer.examples.fsdp_train"
    )
    assert prewarm_module([sys.executable, "-m", "train"]) == "train"
    assert prewarm_module(["python", "train.py"]) is None
    assert prewarm_module(["torchrun", "-m", "x"]) is None
    assert prewarm_module(["python"]) is None


def test_a_spare_runs_the_warm_launcher_with_the_same_launcher_arguments() -> None:
    cfg = TrainerConfig.model_validate(
        {
            "jobName": "j",
            "command": ["python", "-m", "train"],
            "args": [],
            "nnodes": 2,
            "nprocPerNode": 2,
            "rdzvEndpoint": "j-rdzv.ns.svc:29400",
            "rdzvId": "j",
            "maxInJobRestarts": 2,
            "heartbeatIntervalSeconds": 1,
            "rankHangTimeoutSeconds": 20,
            "rankInitialTimeoutSeconds": 60,
            "inProcess": {
                "enabled": True,
                "softTimeoutSeconds": 60,
                "hardTimeoutSeconds": 90,
                "maxRestarts": 10,
            },
            "checkpointDir": "/ckpt",
            "checkpointIntervalSteps": 10,
            "checkpointsToKeep": 2,
            "maxNoProgressCycles": 3,
            "doNotRestartExitCodes": [93, 78],
            "standby": True,
        }
    )
    kw = {
        "local_addr": "10.0.0.5",
        "progress_file": "/p",
        "term_timeout_seconds": 25,
    }
    spare = build_launcher_argv(cfg, launcher=launcher_command(standby=True), **kw)
    worker = build_launcher_argv(cfg, launcher=launcher_command(), **kw)
    assert spare[1:3] == ["-m", "rtj_trainer.warm_launcher"]
    assert spare[3:] == worker[3:], "a promoted spare joins exactly like a worker (nnodes min=max=N)"
    assert "--nnodes=2" in spare
