"""Recovery without rollback, end to end on CPU: examples/fsdp_train.py (FSDP2, 2 gloo ranks) under
`rtj-trainer rendezvous` + `rtj-trainer launch` (NVRx ft_launcher), real processes and files.

- An exception (in-process restart): the ranks keep their shards in memory; the first step after
  the fault is the step after the last completed one (nothing redone) and its loss is the loss of
  an undisturbed run.
- Kept state known bad (NaN written into a weight, then an exception): the ranks reload the newest
  memory snapshot instead.
- A rank SIGKILL (in-job restart): the workers resume from the node-local memory snapshot, newer
  than anything persisted, losing less than one memory-snapshot interval.
- SIGTERM to the pod's entrypoint (a graceful stop): the ranks agree on a step, persist it, exit;
  a new pod without the old pod's memory resumes at exactly that step.
"""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from fsdp_job import FsdpJob, segments, stop
from rtj_trainer.checkpoint import latest_committed
from rtj_trainer.entrypoint import ranks_deadline

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]

STEPS = 60
MEMORY_INTERVAL = 5
PERSIST_INTERVAL = 20
EXCEPTION_STEP, CORRUPT_STEP, SIGKILL_STEP = 25, 37, 53
FAULTS = f"exception:1:{EXCEPTION_STEP};corrupt:0:{CORRUPT_STEP};sigkill:1:{SIGKILL_STEP}"


def _losses(job: FsdpJob, rank: int) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for r in job.records(rank):
        if "loss" in r:
            out.setdefault(r["step"], []).append(r["loss"])
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> FsdpJob:
    job = FsdpJob(tmp_path_factory.mktemp("reference"), STEPS, memory_interval=MEMORY_INTERVAL)
    rc = job.run()
    assert rc == 0, job.log_tail()
    return job


@pytest.fixture(scope="module")
def faulted(tmp_path_factory: pytest.TempPathFactory) -> FsdpJob:
    job = FsdpJob(
        tmp_path_factory.mktemp("faulted"),
        STEPS,
        faults=FAULTS,
        checkpoint_interval=PERSIST_INTERVAL,
        memory_interval=MEMORY_INTERVAL,
    )
    rc = job.run()
    assert rc == 0, job.log_tail()
    return job


@pytest.mark.parametrize("rank", [0, 1])
def test_exception_loses_no_step_and_the_loss_continues(
    faulted: FsdpJob, reference: FsdpJob, rank: int
) -> None:
    segs = segments(faulted.records(rank))
    resume, after = next((r, s) for r, s in segs if r["iteration"] == 1 and r["restart"] == 0)
    assert resume["source"] == "memory", resume
    assert resume["step"] == EXCEPTION_STEP - 1, resume
    assert after[0]["step"] == EXCEPTION_STEP, f"first step after the fault: {after[0]}"
    # Same state and data as an undisturbed run: the same losses after the restart.
    ref = _losses(reference, rank)
    for r in after[:5]:
        assert r["loss"] == pytest.approx(ref[r["step"]][0], rel=1e-4), (r, ref[r["step"]])


@pytest.mark.parametrize("rank", [0, 1])
def test_bad_kept_state_reloads_the_newest_memory_snapshot(faulted: FsdpJob, rank: int) -> None:
    segs = segments(faulted.records(rank))
    resume, after = next((r, s) for r, s in segs if r["iteration"] == 2 and r["restart"] == 0)
    newest_snapshot = (CORRUPT_STEP - 1) // MEMORY_INTERVAL * MEMORY_INTERVAL
    assert (resume["source"], resume["step"]) == ("local", newest_snapshot), resume
    assert after[0]["step"] == newest_snapshot + 1
    # Within the first pod incarnation only the steps after that snapshot were ever redone.
    first_run = Counter(r["step"] for r in faulted.records(rank) if "loss" in r and r["restart"] == 0)
    assert {s for s, n in first_run.items() if n > 1} == set(range(newest_snapshot + 1, CORRUPT_STEP))


@pytest.mark.parametrize("rank", [0, 1])
def test_rank_sigkill_resumes_from_node_memory(faulted: FsdpJob, reference: FsdpJob, rank: int) -> None:
    segs = segments(faulted.records(rank))
    resume, after = next((r, s) for r, s in segs if r["restart"] == 1)
    last_done = SIGKILL_STEP - 1
    assert resume["source"] == "local", resume
    # The newest snapshot the killed rank had committed when it died (its record of the fault says;
    # the survivor ran on after it and holds that step too): nothing committed is lost. A snapshot
    # whose write was still in flight at the kill is; how many steps that costs is a benchmark's
    # figure (bench/gpu_smoke.py), not this test's.
    kill = next(r for r in faulted.records(1) if r.get("event") == "fault" and r["kind"] == "sigkill")
    committed_at_kill = kill["memory_snapshots"]
    assert committed_at_kill and committed_at_kill[0] <= last_done, kill
    assert resume["step"] == committed_at_kill[0], (resume, kill)
    persisted_then = max(
        (r["committed"] or 0 for r in faulted.records(rank) if "loss" in r and r["restart"] == 0), default=0
    )
    assert resume["step"] > persisted_then, "the memory tier was not newer than the persisted checkpoint"
    ref = _losses(reference, rank)
    assert after[0]["loss"] == pytest.approx(ref[after[0]["step"]][0], rel=1e-4)
    # The job completed every step, and the loss fell.
    losses = _losses(faulted, rank)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert min(losses[STEPS]) < 0.5 * min(losses[1])


def test_faulted_run_persists_in_the_background(faulted: FsdpJob) -> None:
    assert latest_committed(str(faulted.ckpt_dir)) == STEPS
    kinds = Counter(r["save"] for r in faulted.records(0) if "loss" in r)
    assert kinds["snapshot"] >= STEPS // MEMORY_INTERVAL // 2, kinds
    assert kinds["saved"] >= 2, kinds
    # Each snapshot's write is in the step log with its seconds, whether it was staged on the GPU
    # (never on CPU) and whether a persist was in flight.
    writes = [r for r in faulted.records(0) if r.get("event") == "snapshot"]
    assert writes and all(r["seconds"] >= 0 and r["staged"] is False for r in writes), writes
    assert {type(r["persisting"]) for r in writes} == {bool}, writes


def test_sigterm_persists_the_current_step_and_the_resume_loses_nothing(tmp_path: Path) -> None:
    job = FsdpJob(tmp_path, steps=400, checkpoint_interval=200, memory_interval=MEMORY_INTERVAL)
    rdzv, launch = job.start()
    try:
        deadline = time.monotonic() + 300
        while job.max_step() < 23:  # past a few memory snapshots, long before the first persist
            assert time.monotonic() < deadline and launch.poll() is None, job.log_tail()
            time.sleep(0.2)
        launch.send_signal(signal.SIGTERM)  # the kubelet's signal to the pod's main process
        rc = launch.wait(60)
    finally:
        stop(launch)
        stop(rdzv)
    assert rc == 143, job.log_tail()
    stopped = [r for rank in (0, 1) for r in job.records(rank) if r.get("event") == "stopped"]
    assert len(stopped) == 2 and stopped[0]["step"] == stopped[1]["step"], stopped
    stop_step = stopped[0]["step"]
    # The ranks committed the step to the pod's memory (one pod: no peer replica) by the deadline
    # the entrypoint gave them (its graceful stop is the job's RTJ_GRACEFUL_STOP_SECONDS) and handed
    # its persist to the entrypoint, which persisted and committed it after they had exited.
    assert all(r["memory"] and not r["replica"] for r in stopped), stopped
    assert all(r["handed_off"] and not r["persisted"] for r in stopped), stopped
    most = ranks_deadline(0, float(job.env(0)["RTJ_GRACEFUL_STOP_SECONDS"]))
    assert all(0 < r["seconds_left"] < most for r in stopped), stopped
    last_trained = max(r["step"] for rank in (0, 1) for r in job.records(rank) if "loss" in r)
    assert last_trained == stop_step
    assert latest_committed(str(job.ckpt_dir)) == stop_step
    for rank in (0, 1):  # what the pod's last heartbeat reads: the persisted step
        report = json.loads((job.status_dir / f"rank-{rank}.json").read_text())
        assert report["checkpoint"]["step"] == stop_step and report["persistSeconds"] > 0, report

    # A new pod: the old pod's memory is gone, only the persisted checkpoint is left.
    shutil.rmtree(job.mem_dir)
    job.steps = stop_step + 5
    assert job.run(tag="-2") == 0, job.log_tail("-2")
    for rank in (0, 1):
        resume, after = segments(job.records(rank))[-1]
        assert (resume["source"], resume["step"]) == ("persistent", stop_step), resume
        assert after[0]["step"] == stop_step + 1
