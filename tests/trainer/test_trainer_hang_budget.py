"""A stalled rank is caught by its learned hang budget (rtj_trainer.hang_timeouts), not by the soft
timeout, and recovered in-process: real `rtj-trainer` processes, NVRx ft_launcher, gloo on CPU. Both
ways a rank stops: `stall` (a Python loop) and `hang` (blocked in a system call, a read from a pipe
that never delivers: NVRx's abort reaches it through `nvrx_patches.apply_interrupting_abort`; without
it the rank waited for the hard timeout).

One pod with one rank: on gloo NVRx cannot abort a collective that a healthy peer is blocked in (it
aborts NCCL only), so a peer's collective timeout would end the stall too; alone, only the rank's
own deadline can. The soft timeout (the ceiling) is 120 s and the test allows 60 s from the stall to
the next step: nothing but the learned budget (5 s after ~0.2 s steps) explains a recovery in time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rtj.contract import ExitCode, FaultReason, FaultSeverity, PodState
from trainer_harness import ToyJob

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

CEILING_SECONDS = 120
STALL_STEP = 15  # right after the checkpoint of step 14: the in-process restart loses no step


@pytest.fixture(params=["stall", "hang"])
def job(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ToyJob]:
    toy = ToyJob(
        tmp_path / "job",
        nnodes=1,
        nproc_per_node=1,
        config={
            "rankHangTimeoutSeconds": 200,  # ft_launcher's heartbeat timeout stays out of it
            "inProcess": {
                "enabled": True,
                "softTimeoutSeconds": CEILING_SECONDS,
                "hardTimeoutSeconds": 2 * CEILING_SECONDS,
                "maxRestarts": 3,
            },
            "hangDetection": {"enabled": True, "floorSeconds": 5, "medianMultiple": 20},
            "checkpointIntervalSteps": 7,
        },
        env={
            "TOY_STEPS": "30",
            "TOY_STEP_SECONDS": "0.2",
            "RTJ_FAULT_INJECT": f"{request.param}:0:{STALL_STEP}",
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "100",
        },
    )
    toy.tmp.mkdir(parents=True)
    yield toy
    toy.stop()


def test_a_stopped_step_is_aborted_by_the_learned_budget_and_restarted_in_process(job: ToyJob) -> None:
    job.start()
    (name,) = job.pods
    assert job.wait_exit(name, 240) == ExitCode.SUCCEEDED, job.dump_logs()

    events = job.events()
    assert max(e["step"] for e in events) == 30
    assert len({e["pid"] for e in events}) == 1, "the rank was replaced: not the in-process path"
    assert {e["ijr"] for e in events} == {0}
    assert {e["ipr"] for e in events} == {0, 1}
    hb = job.pods[name].last_heartbeat()
    assert hb.state is PodState.FINISHED
    assert (hb.in_process_restarts, hb.in_job_restarts) == (1, 0)
    assert hb.fault is not None and hb.fault.reason == FaultReason.RANK_HANG, hb.fault
    assert hb.fault.severity is FaultSeverity.SOFT and "no progress in its step" in hb.fault.message

    stalled_at = max(e["t"] for e in events if e["ipr"] == 0)  # the last step before the stall
    assert max(e["step"] for e in events if e["ipr"] == 0) == STALL_STEP - 1
    back = min((e for e in events if e["ipr"] == 1), key=lambda e: e["t"])
    assert back["step"] == STALL_STEP, "steps were lost or skipped"  # resumed from step 14
    recovered_s = back["t"] - stalled_at
    assert recovered_s < CEILING_SECONDS / 2, f"{recovered_s:.1f} s: the soft timeout, not the budget"
    kind = job.env["RTJ_FAULT_INJECT"].split(":")[0]
    print(f"\nRECOVERY {kind} (learned budget, floor 5 s): {recovered_s:.2f} s to the first step after it")
