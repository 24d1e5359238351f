"""In-place pod restart, the trainer side, on CPU: examples/fsdp_train.py (FSDP2, 2 gloo ranks) under
`rtj-trainer rendezvous` + `rtj-trainer launch` (NVRx ft_launcher), real processes and files.

A rank's SIGKILL spends the launcher's in-job budget (maxInJobRestarts 0). A pod that may restart in
place (RTJ_MAX_IN_PLACE_RESTARTS=1) exits 76 with a Soft RestartingInPlace fault; the entrypoint
started again with the same memory and status dirs (what the kubelet does on the pod's
RestartAllContainers rule) resumes from the memory snapshot the ranks committed before they died
and trains to the end. With its one in-place restart used, the same failure exits 70.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fsdp_job import FsdpJob, segments
from rtj.contract import ENV_MAX_IN_PLACE_RESTARTS, ExitCode, FaultReason, FaultSeverity
from rtj_trainer.pod_incarnation import STARTS_FILE
from trainer_pods import last_heartbeat

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

STEPS, MEMORY_INTERVAL, SIGKILL_STEP = 16, 4, 11


def job(tmp: Path) -> FsdpJob:
    return FsdpJob(
        tmp,
        STEPS,
        faults=f"sigkill:1:{SIGKILL_STEP}",  # once per job: a marker file in the checkpoint dir
        checkpoint_interval=100,  # nothing persisted before the fault: a resume is from memory
        memory_interval=MEMORY_INTERVAL,
        config={"maxInJobRestarts": 0},
        extra_env={ENV_MAX_IN_PLACE_RESTARTS: "1"},
    )


def launch_log(job: FsdpJob, tag: str = "") -> str:
    return (job.tmp / f"launch{tag}.log").read_text(errors="replace")


def test_budget_spent_restarts_in_place_and_resumes_from_the_memory_snapshot(tmp_path: Path) -> None:
    pod = job(tmp_path)
    assert pod.run(timeout=120) == ExitCode.RESTART_IN_PLACE, pod.log_tail()
    log = launch_log(pod)
    assert "container start 1 of this pod; in-place restarts left: 1" in log
    fault = last_heartbeat(log).fault
    assert fault is not None, log[-4000:]
    assert (fault.reason, fault.severity) == (FaultReason.RESTARTING_IN_PLACE, FaultSeverity.SOFT), fault
    assert "in-place restart 1 of 1" in fault.message, fault

    # The kubelet restarts the pod's containers: same memory volume, same checkpoint volume.
    assert pod.run(timeout=120, tag="-2") == ExitCode.SUCCEEDED, pod.log_tail("-2")
    assert "container start 2 of this pod; in-place restarts left: 0" in launch_log(pod, "-2")
    for rank in (0, 1):
        resume, after = segments(pod.records(rank))[-1]
        assert resume["source"] == "local", resume
        assert 0 < resume["step"] < SIGKILL_STEP and resume["step"] % MEMORY_INTERVAL == 0, resume
        assert after[0]["step"] == resume["step"] + 1 and after[-1]["step"] == STEPS


def test_with_its_in_place_restart_used_the_pod_is_replaced(tmp_path: Path) -> None:
    pod = job(tmp_path)
    pod.mem_dir.mkdir()
    (pod.mem_dir / STARTS_FILE).write_text("1\n")  # one container start before this one
    assert pod.run(timeout=120) == ExitCode.LAUNCHER_BUDGET_EXHAUSTED, pod.log_tail()
    log = launch_log(pod)
    assert "container start 2 of this pod; in-place restarts left: 0" in log
    fault = last_heartbeat(log).fault
    assert fault is not None, log[-4000:]
    assert (fault.reason, fault.severity) == (FaultReason.LAUNCHER_BUDGET_EXHAUSTED, FaultSeverity.HARD)
    assert "in-place restarts spent (1 of 1)" in fault.message, fault
