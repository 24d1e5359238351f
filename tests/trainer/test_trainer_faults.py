"""The trainer runtime under faults: real `rtj-trainer` processes, real NVRx ft_launcher, gloo on CPU.

2 "pods" (launchers) x 2 ranks + the rendezvous process on localhost, a toy DDP script
(tests/trainer/toy_train.py) with fault hooks. Each test prints the recovery time it saw
(time from the fault to the first completed step after recovery); bench/recovery_cpu.py
prints them as a table.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtj.contract import ExitCode, FaultReason, FaultSeverity, PodState
from rtj_local.wait import wait_for
from trainer_harness import ToyJob, first_step_after

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(420)]


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator:
    jobs: list[ToyJob] = []

    def _make(**kwargs) -> ToyJob:
        job = ToyJob(tmp_path / f"job{len(jobs)}", **kwargs)
        job.tmp.mkdir(parents=True)
        jobs.append(job)
        return job

    yield _make
    for job in jobs:
        job.stop()


def _pids_by_rank(events: list[dict]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for e in events:
        out.setdefault(e["rank"], set()).add(e["pid"])
    return out


def _fault_time(events: list[dict], rank: int, step: int) -> float:
    """When the fault at `step` fired: just after `rank` completed step-1 for the last time before it."""
    before = [e for e in events if e["rank"] == rank and e["step"] == step - 1]
    assert before, f"rank {rank} never completed step {step - 1}"
    return min(e["t"] for e in before)


def test_rank_exception_is_restarted_in_process(make_job) -> None:
    # Ranks started plainly (no pre-warmed server, whose own freeze test_rank_forkserver covers):
    # the imports are kept out of NVRx's collections by the wrapper's freeze alone.
    job = make_job(env={"TOY_STEPS": "60", "RTJ_FAULT_INJECT": "exception:1:30", "RTJ_RANK_FORKSERVER": "0"})
    job.start()
    job.wait_step(5, 180)
    launchers = job.launcher_pids()
    for name in job.pods:
        assert job.wait_exit(name, 240) == ExitCode.SUCCEEDED, job.dump_logs()

    events = job.events()
    assert max(e["step"] for e in events) == 60
    # Launchers untouched: every step ran under the original launchers, in the original workers.
    assert {e["ppid"] for e in events} == set(launchers.values())
    assert all(len(pids) == 1 for pids in _pids_by_rank(events).values()), _pids_by_rank(events)
    assert {e["ijr"] for e in events} == {0}
    assert {e["ipr"] for e in events} == {0, 1}
    faulty_launcher = next(e["ppid"] for e in events if e["rank"] == 1)
    for name in job.pods:
        hb = job.pods[name].last_heartbeat()
        assert hb.state is PodState.FINISHED
        assert (hb.in_process_restarts, hb.in_job_restarts) == (1, 0)
        assert hb.fault is not None and hb.fault.severity is FaultSeverity.SOFT
        # The pod of the raising rank names the exception; the other saw its collectives break.
        expected = (
            FaultReason.RANK_EXCEPTION if launchers[name] == faulty_launcher else FaultReason.PEER_FAILURE
        )
        assert hb.fault.reason == expected, hb.fault

    # NVRx collects garbage until none is left after every abort: what the imports made before the
    # training function is frozen out of those walks (with the pre-warmed server, 0.44 s -> 0.16 s
    # to the first step on the CPU smoke). What torch imports lazily during the first attempt is not.
    for e in events:
        if "gc_frozen" in e:
            assert e["gc_frozen"] > e["gc_walked"], e

    t_fault = _fault_time(events, 1, 30)
    back = first_step_after(events, t_fault, ipr=1)
    print(
        f"\nRECOVERY in-process (rank exception): {back['t'] - t_fault:.2f} s to the first step after restart"
    )


def test_rank_sigkill_is_restarted_by_the_launcher(make_job) -> None:
    job = make_job(env={"TOY_STEPS": "60", "RTJ_FAULT_INJECT": "sigkill:1:30"})
    job.start()
    job.wait_step(5, 180)
    launchers = job.launcher_pids()
    for name in job.pods:
        assert job.wait_exit(name, 300) == ExitCode.SUCCEEDED, job.dump_logs()

    events = job.events()
    assert max(e["step"] for e in events) == 60
    assert {e["ppid"] for e in events} == set(launchers.values()), "a launcher was replaced"
    pids = _pids_by_rank(events)
    assert all(len(p) == 2 for p in pids.values()), f"every worker restarted exactly once: {pids}"
    assert max(e["ijr"] for e in events if e["rank"] == 1) == 1  # the launcher's own restart count
    killed_launcher = next(e["ppid"] for e in events if e["rank"] == 1)
    for name in job.pods:
        hb = job.pods[name].last_heartbeat()
        assert hb.state is PodState.FINISHED
        # Both pods' workers were restarted (the other pod's through the new rendezvous round).
        assert hb.in_job_restarts == 1, (name, hb)
        if launchers[name] == killed_launcher:  # the pod names the kill (the rank could not)
            assert hb.fault is not None and hb.fault.reason == FaultReason.RANK_EXITED, hb.fault
            assert (
                "(rank 1, pid" in hb.fault.message and "killed by SIGKILL while training" in hb.fault.message
            )
        else:  # collateral: its ranks saw their collectives break, or were stopped by their launcher
            assert hb.fault is not None, name
            assert hb.fault.reason in (FaultReason.PEER_FAILURE, FaultReason.RANK_STOPPED), hb.fault

    t_fault = _fault_time(events, 1, 30)
    first_pid = min(pids[1], key=lambda p: min(e["t"] for e in events if e["pid"] == p))
    back = first_step_after(events, t_fault, rank=1)
    assert back["pid"] != first_pid
    print(f"\nRECOVERY in-job (rank SIGKILL): {back['t'] - t_fault:.2f} s to the first step after restart")


def test_rank_hang_is_detected_and_restarted(make_job) -> None:
    # A rank wedged where no signal reaches it (a hang in a system call is aborted in-process:
    # test_trainer_hang_budget): only NVRx's rank heartbeat timeout ends it.
    job = make_job(
        config={"rankHangTimeoutSeconds": 5},
        env={"TOY_STEPS": "60", "RTJ_FAULT_INJECT": "wedge:1:30"},
    )
    job.start()
    job.wait_step(5, 180)
    launchers = job.launcher_pids()
    for name in job.pods:
        assert job.wait_exit(name, 300) == ExitCode.SUCCEEDED, job.dump_logs()

    events = job.events()
    assert max(e["step"] for e in events) == 60
    assert {e["ppid"] for e in events} == set(launchers.values())
    logs = "".join(p.log_text() for p in job.pods.values())
    assert "Did not get subsequent heartbeat" in logs, "NVRx rank heartbeat timeout did not fire"
    pids = _pids_by_rank(events)
    assert len(pids[1]) == 2, f"the hung rank was replaced: {pids}"
    hung_launcher = next(e["ppid"] for e in events if e["rank"] == 1)
    hung_pod = next(name for name in job.pods if launchers[name] == hung_launcher)
    fault = job.pods[hung_pod].last_heartbeat().fault  # the pod names the hang (the rank could not)
    assert fault is not None and fault.reason == FaultReason.RANK_EXITED, fault
    assert "(rank 1, pid" in fault.message and "hung past rankHangTimeoutSeconds=5" in fault.message

    t_fault = _fault_time(events, 1, 30)
    back = first_step_after(events, t_fault, rank=1)
    print(
        f"\nRECOVERY hang (NVRx heartbeat timeout 5 s): {back['t'] - t_fault:.2f} s "
        "to the first step after restart"
    )


def test_no_progress_stops_with_do_not_restart(make_job) -> None:
    # Rank 1 dies at step 6 after every (re)start; checkpoints every 4 steps: the checkpoint
    # iteration stays at 4, so after maxNoProgressCycles cycles the pods stop with 93.
    job = make_job(
        config={"checkpointIntervalSteps": 4, "maxInJobRestarts": 10, "maxNoProgressCycles": 2},
        env={"RTJ_FAULT_INJECT": "exit:1:6:always"},
    )
    job.start()
    codes = {name: job.wait_exit(name, 360) for name in job.pods}
    assert codes == {name: ExitCode.DO_NOT_RESTART for name in job.pods}, job.dump_logs()
    for name in job.pods:
        hb = job.pods[name].last_heartbeat()
        # Soft: exit code 93 fails the job; a Hard fault would have the operator replace the pod first.
        assert hb.fault is not None and hb.fault.severity is FaultSeverity.SOFT
        assert hb.fault.reason == FaultReason.NO_PROGRESS
        assert hb.checkpoint is not None and hb.checkpoint.step == 4
        assert 2 <= hb.in_job_restarts < 10


def test_permanent_error_stops_every_pod_with_93_and_no_restart(make_job) -> None:
    """issue 13, case 4: a deterministic error (here rank 1 raises PermanentError at step 10 after
    every (re)start, as a checkpoint of another world size does) is final on its first occurrence:
    the pod of the raising rank stops its launcher before any in-job restart and exits 93 (do not
    restart), its heartbeat carrying a Permanent fault that names the error (the operator then fails
    the job PermanentFault and deletes the other pods, whose launchers wait for a round that cannot
    form)."""
    job = make_job(
        config={"maxInJobRestarts": 5, "maxNoProgressCycles": 5},
        env={"TOY_STEPS": "200", "RTJ_FAULT_INJECT": "permanent:1:10:always"},
    )
    job.start()
    ended = wait_for(
        lambda: next((n for n, pod in job.pods.items() if pod.proc.poll() is not None), None),
        240,
        message="the pod of the raising rank to exit",
    )
    assert job.pods[ended].proc.returncode == ExitCode.DO_NOT_RESTART, job.dump_logs()
    fault = job.pods[ended].last_heartbeat().fault
    assert fault is not None and fault.severity is FaultSeverity.PERMANENT, fault
    assert "injected permanent error at step 10" in fault.message, fault
    events = job.events()
    assert {e["ijr"] for e in events} == {0}, "no in-job restart after a permanent error"
    assert {e["ipr"] for e in events} == {0}, "no in-process restart after a permanent error"
    assert max(e["step"] for e in events) < 10


@pytest.mark.parametrize("victim", ["pod hosting rank 0", "pod without rank 0"])
def test_lost_pod_is_replaced_and_training_continues(make_job, victim: str) -> None:
    job = make_job(config={"rankHangTimeoutSeconds": 10})
    job.start()
    events = job.wait_step(40, 240)
    rank0_launcher = max((e for e in events if e["rank"] == 0), key=lambda e: e["t"])["ppid"]
    rank0_pod = job.pod_of_launcher(rank0_launcher)
    name = rank0_pod if victim == "pod hosting rank 0" else next(n for n in job.pods if n != rank0_pod)
    survivor = next(n for n in job.pods if n != name)

    before = job.max_step()
    old_pids = {e["pid"] for e in job.events()}
    t_kill = job.kill_pod(name)
    job.start_pod("replacement")
    back = wait_for(
        lambda: first_step_after(job.events(), t_kill, step_above=before, exclude_pids=old_pids),
        300,
        message="training to continue past the kill",
    )
    # The replacement really trains: its launcher runs ranks that complete steps past the kill.
    wait_for(lambda: job.max_step() >= before + 20, 120, message="20 more steps")
    replacement_launcher = job.launcher_pids()["replacement"]
    assert any(e["ppid"] == replacement_launcher and e["step"] > before for e in job.events())
    assert job.pods[survivor].proc.poll() is None, "the surviving pod must keep running"
    print(
        f"\nRECOVERY lost pod ({victim}): {back['t'] - t_kill:.2f} s from SIGKILL to the first step past "
        f"step {before} (replacement started 0 s after the kill)"
    )


def test_a_launcher_out_of_budget_leaves_the_rendezvous_open_for_its_replacement(make_job) -> None:
    """NVRx shuts the rendezvous down when a launcher gives up; ours stays open (launcher_main), so the
    pod the operator starts in its place joins the survivor and the job trains on."""
    job = make_job(env={"TOY_STEPS": "80"})
    no_budget = {**json.loads(job.trainer_config), "maxInJobRestarts": 0}
    job.start_rendezvous()
    # Whichever global ranks pod0 gets, they die at step 30: its launcher has no restart left.
    job.start_pod("pod0", {"RTJ_TRAINER_CONFIG": json.dumps(no_budget), "RTJ_FAULT_INJECT": "sigkill:*:30"})
    job.start_pod("pod1")
    assert job.wait_exit("pod0", 300) == ExitCode.LAUNCHER_BUDGET_EXHAUSTED, job.dump_logs()
    assert job.pods["pod1"].proc.poll() is None, "the surviving pod waits for a new rendezvous round"
    assert "injecting sigkill at step 30" in job.pods["pod0"].log_text()
    job.start_pod("replacement")
    for name in ("pod1", "replacement"):
        assert job.wait_exit(name, 300) == ExitCode.SUCCEEDED, job.dump_logs()
    assert job.max_step() == 80
    assert not [n for n, pod in job.pods.items() if "RendezvousClosedError" in pod.log_text()]


def test_when_every_launcher_is_out_of_budget_replacement_pods_still_form_a_round(make_job) -> None:
    """Both launchers give up (budget 0): the operator replaces both pods, and they must be able to
    rendezvous, although no surviving launcher is left to open the next round."""
    job = make_job(config={"maxInJobRestarts": 0}, env={"TOY_STEPS": "60"})
    job.start_rendezvous()
    job.start_pod("pod0", {"RTJ_FAULT_INJECT": "sigkill:*:20"})
    job.start_pod("pod1")
    for name in ("pod0", "pod1"):
        assert job.wait_exit(name, 300) == ExitCode.LAUNCHER_BUDGET_EXHAUSTED, job.dump_logs()
    replacements = ("pod0-a1", "pod1-a1")
    for name in replacements:
        job.start_pod(name)
    for name in replacements:
        assert job.wait_exit(name, 300) == ExitCode.SUCCEEDED, job.dump_logs()
    assert job.max_step() == 60


def test_lost_rendezvous_is_rejoined_inside_the_same_pods(make_job) -> None:
    """issue 13, case 1: the rendezvous pod dies. Every launcher fails at once (its store is gone);
    before, every pod then exited 70 and the operator replaced them all. Now each pod's entrypoint
    waits for the recreated rendezvous and starts ft_launcher again inside the same pod (its node,
    its GPUs, its /dev/shm snapshots kept), and the job trains to the end."""
    job = make_job(env={"TOY_STEPS": "80"})
    job.start()
    job.wait_step(20, 180)
    launchers = set(job.launcher_pids().values())
    old_pids = {e["pid"] for e in job.events()}
    t_kill = job.kill_rendezvous()
    time.sleep(2)  # the operator notices and recreates the rendezvous pod
    job.start_rendezvous()
    for name in job.pods:
        assert job.wait_exit(name, 300) == ExitCode.SUCCEEDED, job.dump_logs()
    events = job.events()
    assert max(e["step"] for e in events) == 80
    after = [e for e in events if e["pid"] not in old_pids]
    assert after and not {e["ppid"] for e in after} & launchers, "the new ranks ran under new launchers"
    for name, pod in job.pods.items():
        assert "rendezvous lost: starting ft_launcher again" in pod.log_text(), name
        fault = pod.last_heartbeat().fault  # the operator's lastFault
        reason = fault.reason if fault is not None else None
        assert reason == FaultReason.RENDEZVOUS_LOST, (name, fault, job.dump_logs())
    back = first_step_after(events, t_kill, exclude_pids=old_pids)
    assert back is not None
    print(f"\nRECOVERY lost rendezvous (relaunch in the pods): {back['t'] - t_kill:.2f} s from SIGKILL "
          "to the first step (rendezvous restarted 2 s after the kill)")  # fmt: skip


def test_sigterm_stops_gracefully_with_143(make_job) -> None:
    job = make_job()
    job.start()
    job.wait_step(5, 180)
    t = time.monotonic()
    os.kill(job.pods["pod0"].proc.pid, signal.SIGTERM)
    assert job.wait_exit("pod0", 60) == ExitCode.TERMINATED
    print(f"\nSIGTERM to exit: {time.monotonic() - t:.2f} s")
    # Its last heartbeat says it stopped: its ranks are gone, but none is restarting.
    assert job.pods["pod0"].last_heartbeat().state == PodState.STOPPED


def test_invalid_config_exits_78_naming_the_field(make_job) -> None:
    job = make_job()
    job.trainer_config = '{"jobName": "x", "nnodes": "two"}'
    pod = job.start_pod("bad")
    assert job.wait_exit("bad", 60) == ExitCode.CONFIG_ERROR
    text = pod.log_text()
    assert "RTJ_TRAINER_CONFIG is invalid" in text
    assert "nnodes" in text and "command" in text
