"""Permanent errors on the trainer side: found in an exception chain, reported with severity
Permanent, and carried by the pod's heartbeat over any hard or soft fault (issue 13, case 4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rtj.contract import FaultSeverity
from rtj_trainer.checkpoint_format import CheckpointError, WorldSizeMismatch
from rtj_trainer.heartbeat import Aggregator, read_rank_files
from rtj_trainer.permanent import PermanentError, permanent_cause, report_permanent
from rtj_trainer.report import RankReporter

pytestmark = pytest.mark.unit


def test_world_size_mismatch_is_a_permanent_checkpoint_error() -> None:
    exc = WorldSizeMismatch("/ckpt/step-0000000100 was written by 2 ranks, this job has 3")
    assert isinstance(exc, CheckpointError) and permanent_cause(exc) is exc


def test_permanent_cause_follows_the_chain() -> None:
    root = PermanentError("bad config")
    try:
        try:
            raise root
        except PermanentError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert permanent_cause(outer) is root
    assert permanent_cause(CheckpointError("torn shard")) is None
    assert permanent_cause(None) is None


def test_reported_permanent_fault_wins_over_a_newer_hard_fault(tmp_path) -> None:
    r0 = RankReporter(str(tmp_path), rank=0, local_rank=0)
    r1 = RankReporter(str(tmp_path), rank=1, local_rank=1)
    report_permanent(r0, WorldSizeMismatch("written by 2 ranks, this job has 3"))
    r1.fault(FaultSeverity.HARD, "GpuXid", "Xid 79")
    hb = Aggregator().update(read_rank_files(str(tmp_path)), lambda pid: True)
    assert hb.fault is not None
    assert (hb.fault.severity, hb.fault.reason) == (FaultSeverity.PERMANENT, "WorldSizeMismatch")
    assert hb.fault.time <= datetime.now(UTC) + timedelta(seconds=1)
