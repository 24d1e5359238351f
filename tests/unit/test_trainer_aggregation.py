"""Heartbeat aggregation (rank files -> contract.Heartbeat), the no-progress rule, RankReporter files."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest
from rtj.contract import (
    API_GROUP,
    API_VERSION,
    HEARTBEAT_ANNOTATION,
    KIND,
    FaultReason,
    FaultSeverity,
    Heartbeat,
    PodState,
    RankReport,
    parse_heartbeat,
    parse_rank_report,
)
from rtj_trainer.heartbeat import Aggregator, LeaseWriter, PodIdentity, read_rank_files
from rtj_trainer.rank_exit import RankExit
from rtj_trainer.report import RankReporter

pytestmark = pytest.mark.unit

ALIVE = {100, 101, 200, 201}


def alive(pid: int) -> bool:
    return pid in ALIVE


def raw_doc(local_rank: int, pid: int, state: str = "Training", step: int | None = 10, **kw) -> dict:
    """A rank file's JSON object, as RankReporter writes it (camelCase keys)."""
    return {
        "rank": local_rank,
        "localRank": local_rank,
        "pid": pid,
        "state": state,
        "step": step,
        "inProcessRestarts": kw.get("ipr", 0),
        "inJobRestarts": kw.get("ijr", 0),
        "checkpoint": kw.get("checkpoint"),
        "checkpointsSkipped": kw.get("skipped", 0),
        "fault": kw.get("fault"),
        "memorySnapshotStep": kw.get("mem"),
        "persistSeconds": kw.get("persist"),
        "replicaStep": kw.get("replica"),
    }


def doc(*args, **kw) -> RankReport:
    """The rank file of raw_doc(...), read as the heartbeat agent reads it."""
    report = parse_rank_report(json.dumps(raw_doc(*args, **kw)))
    assert report is not None
    return report


def test_step_is_the_slowest_rank_and_state_the_most_severe() -> None:
    agg = Aggregator()
    hb = agg.update([doc(0, 100, step=12), doc(1, 101, "Checkpointing", step=11)], alive)
    assert (hb.state, hb.step) == (PodState.CHECKPOINTING, 11)
    hb = agg.update([doc(0, 100, "InProcessRestarting", step=12), doc(1, 101, step=13)], alive)
    assert hb.state == PodState.IN_PROCESS_RESTARTING


def test_no_rank_files_means_starting() -> None:
    assert Aggregator().update([], alive).state == PodState.STARTING


def test_finished_only_when_every_rank_finished() -> None:
    agg = Aggregator()
    assert agg.update([doc(0, 100, "Finished"), doc(1, 101)], alive).state == PodState.TRAINING
    assert agg.update([doc(0, 100, "Finished"), doc(1, 999, "Finished")], alive).state == PodState.FINISHED


def test_dead_rank_means_in_job_restart_and_keeps_the_last_step() -> None:
    agg = Aggregator()
    agg.update([doc(0, 100, step=30), doc(1, 101, step=31)], alive)
    hb = agg.update([doc(0, 100, step=31), doc(1, 555, step=31)], alive)  # 555 is dead
    assert hb.state == PodState.IN_JOB_RESTARTING
    assert hb.step == 31
    # New workers have not reported a step yet: the pod's step does not drop to 0.
    hb = agg.update([doc(0, 200, "Starting", step=None), doc(1, 201, "Starting", step=None)], alive)
    assert (hb.state, hb.step) == (PodState.STARTING, 31)


def test_in_job_restarts_count_worker_generations_and_the_launcher_counter() -> None:
    agg = Aggregator()
    agg.update([doc(0, 100), doc(1, 101)], alive)
    # Restarted because a peer pod failed: the launcher's counter stays 0, the workers are new.
    hb = agg.update([doc(0, 200), doc(1, 201)], alive)
    assert hb.in_job_restarts == 1
    hb = agg.update([doc(0, 200), doc(1, 201)], alive)  # same generation again: no double count
    assert hb.in_job_restarts == 1
    assert agg.update([doc(0, 200, ijr=3), doc(1, 201, ijr=3)], alive).in_job_restarts == 3


def test_in_process_restarts_sum_over_generations_and_never_decrease() -> None:
    agg = Aggregator()
    assert agg.update([doc(0, 100, ipr=2), doc(1, 101, ipr=2)], alive).in_process_restarts == 2
    # New workers start counting at 0 again; the pod total keeps the earlier 2.
    assert agg.update([doc(0, 200, ipr=0), doc(1, 201, ipr=0)], alive).in_process_restarts == 2
    assert agg.update([doc(0, 200, ipr=1), doc(1, 201, ipr=1)], alive).in_process_restarts == 3


def test_newest_checkpoint_and_hard_fault_wins() -> None:
    agg = Aggregator()
    t1, t2 = "2026-01-01T00:00:01+00:00", "2026-01-01T00:00:02+00:00"
    soft = {"severity": "Soft", "reason": "RankException", "message": "x", "time": t2}
    hard = {"severity": "Hard", "reason": "GpuXid", "message": "79", "time": t1}
    hb = agg.update(
        [
            doc(0, 100, checkpoint={"step": 40, "time": t1}, fault=hard),
            doc(1, 101, checkpoint={"step": 20, "time": t2}, fault=soft, skipped=2),
        ],
        alive,
    )
    assert hb.checkpoint.step == 40
    assert hb.fault.severity == FaultSeverity.HARD and hb.fault.reason == "GpuXid"
    assert hb.checkpoints_skipped == 2


def test_memory_snapshot_step_is_the_newest_every_rank_holds() -> None:
    agg = Aggregator()
    assert agg.update([doc(0, 100), doc(1, 101)], alive).memory_snapshot_step is None
    assert agg.update([doc(0, 100, mem=20), doc(1, 101, mem=10)], alive).memory_snapshot_step == 10
    # A restarted rank has not reported yet: the pod still holds what it held.
    assert agg.update([doc(0, 100, mem=30), doc(1, 201)], alive).memory_snapshot_step == 10
    assert agg.update([doc(0, 100, mem=30), doc(1, 201, mem=30)], alive).memory_snapshot_step == 30
    hb = parse_heartbeat(
        {HEARTBEAT_ANNOTATION: agg.update([doc(0, 100, mem=40), doc(1, 201, mem=40)], alive).to_annotation()}
    )
    assert hb is not None and hb.memory_snapshot_step == 40


def test_replica_step_is_the_newest_every_rank_of_the_pod_saw_replicated() -> None:
    agg = Aggregator()
    assert agg.update([doc(0, 100, replica=20), doc(1, 101)], alive).replica_step is None
    assert agg.update([doc(0, 100, replica=20), doc(1, 101, replica=18)], alive).replica_step == 18
    hb = parse_heartbeat(
        {
            HEARTBEAT_ANNOTATION: agg.update(
                [doc(0, 100, replica=24), doc(1, 101, replica=22)], alive
            ).to_annotation()
        }
    )
    assert hb is not None and hb.replica_step == 22


def test_persist_seconds_is_the_longest_any_rank_measured() -> None:
    agg = Aggregator()
    assert agg.update([doc(0, 100), doc(1, 101)], alive).persist_seconds is None
    assert agg.update([doc(0, 100, persist=4.0), doc(1, 101, persist=9.5)], alive).persist_seconds == 9.5
    assert agg.update([doc(0, 100, persist=2.0), doc(1, 201)], alive).persist_seconds == 9.5  # kept


def test_reporter_writes_the_persist_seconds(tmp_path) -> None:
    r = RankReporter(str(tmp_path))
    r.persisted(7.25)
    hb = Aggregator().update(read_rank_files(str(tmp_path)), lambda _pid: True)
    assert hb.persist_seconds == 7.25


def test_malformed_rank_content_is_ignored_not_fatal() -> None:
    agg = Aggregator()
    bad = raw_doc(0, 100, step=-5, checkpoint={"step": "x"}, fault={"severity": "Weird"}, ipr=1.0)
    bad.update(state="Dancing", pid=True, persistSeconds=float("inf"), checkpointsSkipped=-1)
    report = parse_rank_report(json.dumps(bad))
    assert report is not None  # each malformed field reads as its default; the rest is kept
    assert (report.local_rank, report.pid, report.state, report.step) == (0, None, PodState.STARTING, None)
    assert (report.in_process_restarts, report.persist_seconds, report.checkpoints_skipped) == (0, None, 0)
    hb = agg.update([report, doc(1, 101, step=2**60)], alive)
    assert hb.step == 0 and hb.checkpoint is None and hb.fault is None
    assert hb.state == PodState.STARTING
    assert parse_rank_report(b"[1, 2]") is None and parse_rank_report(b'{"state": "Train') is None


def test_a_rank_reporting_the_agents_own_standby_state_reads_as_starting() -> None:
    hb = Aggregator().update([doc(0, 100, "Standby"), doc(1, 101, "Training")], alive)
    assert hb.state == PodState.STARTING


def test_rank_file_keeps_its_camel_case_keys(tmp_path) -> None:
    """The file format is the contract's: these keys, in this order, null while unknown."""
    r = RankReporter(str(tmp_path), rank=3, local_rank=1, in_job_restarts=2)
    r.checkpoint_committed(5, datetime(2026, 1, 1, tzinfo=UTC))
    r.fault(FaultSeverity.SOFT, FaultReason.RANK_EXCEPTION, "boom")
    raw = json.loads((tmp_path / "rank-1.json").read_text())
    assert list(raw) == [
        "rank",
        "localRank",
        "pid",
        "state",
        "step",
        "inProcessRestarts",
        "inJobRestarts",
        "checkpoint",
        "memorySnapshotStep",
        "replicaStep",
        "persistSeconds",
        "checkpointsSkipped",
        "fault",
        "updated",
        "heartbeat",
    ]
    assert (raw["rank"], raw["localRank"], raw["inJobRestarts"], raw["state"]) == (3, 1, 2, "Starting")
    assert (raw["step"], raw["memorySnapshotStep"], raw["persistSeconds"]) == (None, None, None)
    assert raw["checkpoint"] == {"step": 5, "time": "2026-01-01T00:00:00Z"}
    assert list(raw["fault"]) == ["severity", "reason", "message", "time"]
    assert (raw["fault"]["severity"], raw["fault"]["reason"]) == ("Soft", "RankException")


def test_reporter_files_feed_the_aggregator(tmp_path) -> None:
    r0 = RankReporter(str(tmp_path), rank=4, local_rank=0, write_interval=0.0)
    r1 = RankReporter(str(tmp_path), rank=5, local_rank=1, write_interval=0.0)
    for r in (r0, r1):
        r.state(PodState.TRAINING)
    r0.step(7)
    r1.step(6)
    r1.checkpoint_committed(5, datetime(2026, 1, 1, tzinfo=UTC))
    r0.in_process_restart(1)
    r0.fault(FaultSeverity.SOFT, FaultReason.RANK_EXCEPTION, "boom")
    hb = Aggregator().update(read_rank_files(str(tmp_path)))
    assert hb.step == 6
    assert hb.state == PodState.IN_PROCESS_RESTARTING
    assert hb.checkpoint.step == 5
    assert hb.in_process_restarts == 1
    assert hb.fault.reason == FaultReason.RANK_EXCEPTION
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json", "rank-1.json"]  # no tmp left


def test_step_writes_are_throttled(tmp_path) -> None:
    r = RankReporter(str(tmp_path), write_interval=3600)
    r.step(1)  # first write happened at construction; this one is throttled
    r.step(2)
    assert json.loads((tmp_path / "rank-0.json").read_text())["step"] is None
    r.state(PodState.TRAINING)  # a state change writes at once, with the latest step
    assert json.loads((tmp_path / "rank-0.json").read_text())["step"] == 2


class _BeatRecorder:
    """Stands in for the NVRx RankMonitorClient the reporter is given (our ft_client seam)."""

    def __init__(self) -> None:
        self.beats = 0

    def send_heartbeat(self) -> None:
        self.beats += 1


def test_event_writes_do_not_starve_the_nvrx_heartbeat(tmp_path) -> None:
    """A memory snapshot every few steps writes the file more often than the step interval; the
    rank must still send NVRx heartbeats (ft_launcher SIGKILLs a rank silent for its timeout: the
    e2e peer-replica row lost both pods' launcher budgets to this)."""
    ft = _BeatRecorder()
    r = RankReporter(str(tmp_path), write_interval=0.05, ft_client=ft)
    deadline = time.monotonic() + 0.6
    step = 0
    while time.monotonic() < deadline:
        step += 1
        r.memory_snapshot(step)  # an event write, every step: sooner than write_interval
        r.step(step)
        time.sleep(0.02)
    assert ft.beats >= 3, ft.beats


def test_every_nvrx_heartbeat_rewrites_the_file_with_its_time_and_event_writes_keep_it(tmp_path) -> None:
    """The agent measures a killed rank's silence from the heartbeat NVRx last heard, which an
    event write (a memory snapshot between two heartbeats) must not move."""
    ft = _BeatRecorder()
    r = RankReporter(str(tmp_path), write_interval=0.2, ft_client=ft)
    path = tmp_path / "rank-0.json"
    before = datetime.now(UTC)
    r.step(1)
    beat = parse_rank_report(path.read_text()).heartbeat
    assert ft.beats == 1 and beat is not None and beat >= before
    r.memory_snapshot(1)  # an event write: the file changes, its heartbeat does not
    written = parse_rank_report(path.read_text())
    assert written.memory_snapshot_step == 1 and written.heartbeat == beat and written.updated > beat
    r.step(2)  # within write_interval: no heartbeat
    assert ft.beats == 1 and parse_rank_report(path.read_text()).heartbeat == beat
    r.keep_alive(time.monotonic() + 0.25)  # outside the steps, as a rank waiting for its peers does
    assert ft.beats == 2 and parse_rank_report(path.read_text()).heartbeat > beat


def test_progress_file_is_written_by_local_rank_0_only(tmp_path) -> None:
    progress = tmp_path / "p"
    RankReporter(str(tmp_path), local_rank=1, progress_file=str(progress)).checkpoint_committed(8)
    assert not progress.exists()
    RankReporter(str(tmp_path), local_rank=0, progress_file=str(progress)).checkpoint_committed(8)
    assert progress.read_text().strip() == "8"


def test_reporter_without_status_dir_is_a_no_op() -> None:
    r = RankReporter(None)
    r.step(1)
    r.state(PodState.TRAINING)
    r.checkpoint_committed(1)
    assert not r.enabled


def test_lease_body_carries_heartbeat_owner_and_times() -> None:
    w = LeaseWriter.__new__(LeaseWriter)
    w._pod = PodIdentity(name="j-n0-a0", namespace="ml", uid="u-1")
    w._duration = 30
    w._acquire_time = None
    w._written = False
    hb = Heartbeat(state=PodState.TRAINING, step=3)
    t = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    body = w.body(hb, t, create=True)
    assert body["metadata"]["name"] == "j-n0-a0"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "j-n0-a0", "uid": "u-1"}
    ]
    assert "ownerReferences" not in w.body(hb, t)["metadata"]  # a renewal never rewrites the owners
    assert body["spec"] == {
        "holderIdentity": "j-n0-a0",
        "leaseDurationSeconds": 30,
        "acquireTime": "2026-05-01T12:00:00.123456Z",
        "renewTime": "2026-05-01T12:00:00.123456Z",
    }
    assert parse_heartbeat(body["metadata"]["annotations"]) == hb
    assert HEARTBEAT_ANNOTATION in body["metadata"]["annotations"]


def test_a_lease_recreated_after_it_vanished_is_owned_by_the_job() -> None:
    """Its pod may be gone (replaced on a node whose kubelet stopped): owned by the job, garbage
    collection keeps it until the operator has fenced it."""
    w = LeaseWriter.__new__(LeaseWriter)
    w._pod = PodIdentity(name="j-n0-a0", namespace="ml", uid="u-1", job_name="j", job_uid="job-uid")
    w._duration, w._acquire_time, w._written = 30, None, True
    body = w.body(Heartbeat(state=PodState.TRAINING), datetime(2026, 5, 1, tzinfo=UTC), create=True)
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": "j", "uid": "job-uid"}
    ]


def test_root_cause_beats_collateral_peer_failures() -> None:
    agg = Aggregator()
    root = {
        "severity": "Soft",
        "reason": "RankException",
        "message": "boom",
        "time": "2026-01-01T00:00:01+00:00",
    }
    peer = {
        "severity": "Soft",
        "reason": "PeerFailure",
        "message": "gloo",
        "time": "2026-01-01T00:00:04+00:00",
    }
    hb = agg.update([doc(0, 100, fault=root), doc(1, 101, fault=peer)], alive)
    assert hb.fault.reason == FaultReason.RANK_EXCEPTION
    newer = {**peer, "reason": "RankException", "time": "2026-01-01T00:01:00+00:00"}
    assert agg.update([doc(1, 101, fault=newer)], alive).fault.time.minute == 1


def test_classify_exception() -> None:
    import torch.distributed as dist
    from rtj_trainer.inprocess import classify_exception

    assert classify_exception(RuntimeError("injected")) is FaultReason.RANK_EXCEPTION
    assert (
        classify_exception(RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error"))
        is FaultReason.PEER_FAILURE
    )
    assert classify_exception(dist.DistNetworkError("store closed")) is FaultReason.PEER_FAILURE


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (RuntimeError("injected"), FaultReason.RANK_EXCEPTION),
        (RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error"), FaultReason.PEER_FAILURE),
        # NVRx's monitor stopped the rank for another rank's fault before any collective of its own
        # broke (RankShouldRestart with no cause): collateral, never a restart with no fault (CI).
        (None, FaultReason.PEER_FAILURE),
    ],
    ids=["own-exception", "broken-collective", "stopped-by-the-jobs-restart"],
)
def test_every_in_process_restart_reports_why_the_rank_stopped(tmp_path, exc, reason) -> None:
    from rtj_trainer.inprocess import record_restart

    reporter = RankReporter(str(tmp_path), rank=1, local_rank=1)
    record_restart(reporter, 1, exc, 1)
    hb = Aggregator().update(read_rank_files(str(tmp_path)), lambda _pid: True)
    assert hb.in_process_restarts == 1
    assert hb.fault is not None and hb.fault.severity is FaultSeverity.SOFT and hb.fault.reason == reason


# --- a rank that ended without a word -------------------------------------------------------------
T0 = datetime(2026, 1, 1, tzinfo=UTC)
EXCEPTION_AT_8 = {"severity": "Soft", "reason": "RankException", "message": "step 8", "time": T0.isoformat()}


def ended(pid: int, sig: int | None = None, code: int | None = None, seconds: float = 30.0) -> RankExit:
    return RankExit(pid, sig, code, (T0 + timedelta(seconds=seconds)).timestamp())


def test_a_rank_killed_while_training_is_the_pods_fault_not_its_recovered_exception() -> None:
    """The InJobRestart Event quotes the pod's fault: a SIGKILLed rank reports nothing itself, and
    before this the pod's heartbeat kept the exception it had recovered from in process."""
    agg = Aggregator()
    agg.update([doc(0, 100, fault=EXCEPTION_AT_8), doc(1, 101)], alive)  # recovered: training
    exits = {101: ended(101, sig=signal.SIGKILL)}
    updated = {"updated": (T0 + timedelta(seconds=29)).isoformat()}
    killed = parse_rank_report(json.dumps({**raw_doc(1, 101, step=20), **updated}))
    reports = [doc(0, 100, fault=EXCEPTION_AT_8), killed]
    hb = agg.update(reports, lambda pid: pid != 101, lambda r: exits.get(r.pid))
    assert hb.fault is not None and hb.fault.reason == FaultReason.RANK_EXITED
    assert hb.fault.message == (
        "local rank 1 (rank 1, pid 101) killed by SIGKILL while training at step 20, "
        "1s after its last report, reporting no fault"
    )
    assert hb.fault.time == T0 + timedelta(seconds=30)
    # Seen again (the rank file stays until the new worker writes its own): the same fault.
    assert agg.update(reports, lambda pid: pid != 101, lambda r: exits.get(r.pid)).fault == hb.fault


def test_ranks_their_launcher_stopped_are_collateral() -> None:
    exits = {555: ended(555, sig=signal.SIGKILL), 556: ended(556, sig=signal.SIGTERM)}
    for order in ([doc(0, 556), doc(1, 555)], [doc(1, 555), doc(0, 556)]):
        agg = Aggregator()
        hb = agg.update(order, alive, lambda r: exits.get(r.pid))
        assert hb.fault.reason == FaultReason.RANK_EXITED, order
    # Only stopped (a peer pod's rank failed): that is this pod's news, not the recovered exception.
    agg = Aggregator()
    agg.update([doc(0, 556, fault=EXCEPTION_AT_8)], lambda pid: True)
    hb = agg.update([doc(0, 556, fault=EXCEPTION_AT_8)], alive, lambda r: exits.get(r.pid))
    assert hb.fault.reason == FaultReason.RANK_STOPPED
    assert (
        "killed by SIGTERM while training at step 10: its launcher restarts the workers" in hb.fault.message
    )


def test_a_root_cause_the_pod_has_not_recovered_from_outranks_the_stopped_ranks() -> None:
    """One incident: rank 0 reported its exception and is restarting; rank 1, stopped by the
    launcher, is collateral; so is a later PeerFailure while the pod has not trained since."""
    exits = {556: ended(556, sig=signal.SIGTERM, seconds=1)}
    root = {**EXCEPTION_AT_8, "time": (T0 + timedelta(seconds=0.5)).isoformat()}
    agg = Aggregator()
    hb = agg.update(
        [doc(0, 100, "InProcessRestarting", fault=root), doc(1, 556)], alive, lambda r: exits.get(r.pid)
    )
    assert hb.fault.reason == FaultReason.RANK_EXCEPTION


def test_an_explained_or_graceful_end_adds_no_fault() -> None:
    exits = {555: ended(555, code=1), 556: ended(556, code=143)}
    agg = Aggregator()
    # 555 ended while in-process restarting: its own reported fault says why.
    hb = agg.update(
        [doc(0, 555, "InProcessRestarting", fault=EXCEPTION_AT_8), doc(1, 556)],
        alive,
        lambda r: exits.get(r.pid),
    )
    assert hb.fault.reason == FaultReason.RANK_EXCEPTION  # 556: 143 after the pod's graceful stop
    assert Aggregator().update([doc(0, 555, "Finished")], alive, lambda r: exits.get(r.pid)).fault is None


def test_without_the_rank_forkserver_a_rank_that_ended_says_so_without_how() -> None:
    hb = Aggregator().update([doc(0, 555, step=4)], alive, now=T0)
    assert hb.fault.reason == FaultReason.RANK_EXITED
    assert hb.fault.message.startswith("local rank 0 (rank 0, pid 555) ended while training at step 4")
    assert hb.fault.time == T0


@pytest.mark.parametrize("peer_first", [False, True])
def test_a_newer_fault_replaces_a_recovered_one_but_a_rank_files_old_fault_does_not(peer_first: bool) -> None:
    agg = Aggregator()
    agg.update([doc(0, 100, fault=EXCEPTION_AT_8), doc(1, 101)], alive)  # training: over
    peer = {
        "severity": "Soft",
        "reason": "PeerFailure",
        "message": "gloo",
        "time": "2026-01-01T00:01:00+00:00",
    }
    reports = [doc(0, 100, fault=EXCEPTION_AT_8), doc(1, 101, fault=peer)]
    reports = reports[::-1] if peer_first else reports
    assert agg.update(reports, alive).fault.reason == FaultReason.PEER_FAILURE, "the next incident's news"
    hb = agg.update(reports, alive)
    assert hb.fault.reason == FaultReason.PEER_FAILURE, "rank 0's file still holds the old exception"


def test_a_rank_restarted_between_two_updates_is_reported_from_its_last_report() -> None:
    """The launcher restarted the rank before the agent saw its pid gone: only a new pid shows it."""
    exits = {100: ended(100, sig=signal.SIGTERM), 101: ended(101, sig=signal.SIGKILL)}
    agg = Aggregator()
    agg.update([doc(0, 100), doc(1, 101, step=30)], alive)
    hb = agg.update(
        [doc(0, 200, "Starting", step=None), doc(1, 201, "Starting", step=None)],
        alive,
        lambda r: exits.get(r.pid),
    )
    assert hb.in_job_restarts == 1
    assert hb.fault is not None and hb.fault.reason == FaultReason.RANK_EXITED
    assert "(rank 1, pid 101) killed by SIGKILL while training at step 30" in hb.fault.message


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_rank_silent_past_the_rank_hang_timeout_was_hung_whatever_ended_it(sig: int) -> None:
    """NVRx stops a rank silent for rankHangTimeoutSeconds through its launcher (SIGTERM, then
    SIGKILL): that rank is this incident's root cause, not a rank stopped for a peer's fault."""
    exits = {101: ended(101, sig=sig, seconds=30)}
    updated = {"updated": (T0 + timedelta(seconds=9)).isoformat()}
    hung = parse_rank_report(json.dumps({**raw_doc(1, 101, step=31), **updated}))
    agg = Aggregator(rank_hang_timeout_seconds=20)
    hb = agg.update([hung], lambda pid: pid != 101, lambda r: exits.get(r.pid))
    assert hb.fault.reason == FaultReason.RANK_EXITED
    assert hb.fault.message.endswith(
        f"killed by {signal.Signals(sig).name} while training at step 31, 21s after its last report: "
        "hung past rankHangTimeoutSeconds=20"
    )
    # Silent for less than the timeout: stopped with the others.
    recent = parse_rank_report(
        json.dumps({**raw_doc(1, 101, step=31), "updated": (T0 + timedelta(seconds=29)).isoformat()})
    )
    hb = Aggregator(rank_hang_timeout_seconds=20).update(
        [recent], lambda pid: pid != 101, lambda r: exits.get(r.pid)
    )
    expected = FaultReason.RANK_STOPPED if sig == signal.SIGTERM else FaultReason.RANK_EXITED
    assert hb.fault.reason == expected


def test_a_hung_rank_is_timed_from_its_last_heartbeat_not_a_later_event_write() -> None:
    """A rank wrote its memory snapshot's step 0.5 s after its last NVRx heartbeat, then hung; NVRx
    killed it rankHangTimeoutSeconds after that heartbeat: hung, though under the timeout since the
    write (CI: test_rank_hang_is_detected_and_restarted read "reporting no fault")."""
    exits = {101: ended(101, sig=signal.SIGKILL, seconds=5.2)}
    times = {"heartbeat": T0.isoformat(), "updated": (T0 + timedelta(seconds=0.5)).isoformat()}
    hung = parse_rank_report(json.dumps({**raw_doc(1, 101, step=28), **times}))
    hb = Aggregator(rank_hang_timeout_seconds=5).update(
        [hung], lambda pid: pid != 101, lambda r: exits.get(r.pid)
    )
    assert hb.fault.reason == FaultReason.RANK_EXITED
    assert hb.fault.message.endswith(
        "killed by SIGKILL while training at step 28, 5s after its last heartbeat: "
        "hung past rankHangTimeoutSeconds=5"
    )
