"""A job's pass runs on change, not on a clock (rtj.ladder.wakeups, issue 18), against the real API
server: the operator runs with a resync interval of 10 minutes, so everything below that happens
within seconds was woken by a change (a pod, the job's spec, a Lease's content) or by the job's own
heartbeat deadline; and heartbeat renewals that change nothing run no pass."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from kubernetes import client
from operator_harness import OperatorEnv, end_pod, running, until
from rtj import contract, reasons
from rtj.api.status_slots import every_slot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PASSES = re.compile(r"^rtj_reconcile_duration_seconds_count (\S+)$", re.M)


def passes(e: OperatorEnv) -> float:
    found = PASSES.search(e.operator.metrics())
    return float(found.group(1)) if found else 0.0


def test_passes_wake_on_changes_and_deadlines_not_on_renewals(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=3, RTJ_RECONCILE_INTERVAL_SECONDS="600")
    e.create_job("train", 2, faultTolerance={"heartbeatTimeoutSeconds": 8})
    t = e.trainers("train")
    # Pods created, then Running, then heartbeating: each step is a pod or Lease change.
    until(running(e, "train", 2), t, 90, e.explain("train"))

    # Renewals whose content changes only by progress (the step, a committed checkpoint): at most
    # one pass per progress refresh (RTJ_PROGRESS_REFRESH_SECONDS, 5 s by default), not one per
    # renewal (a 1 s timer would run ~10, a pass per renewal ~20).
    pods = ["train-n0-a0", "train-n1-a0"]
    before, step, t0 = passes(e), 0, time.monotonic()

    def progress(step: int) -> contract.Heartbeat:
        committed = contract.CheckpointRef(step=step - step % 5, time=datetime.now(UTC))
        return contract.Heartbeat(state=contract.PodState.TRAINING, step=step, checkpoint=committed)

    def renewed_for_ten_seconds() -> bool:
        nonlocal step
        step += 1
        t.heartbeats = {p: progress(step) for p in pods}
        return time.monotonic() - t0 >= 10

    until(renewed_for_ten_seconds, t, 30, e.explain("train"))
    ran = passes(e) - before
    assert ran <= 3, f"{ran} passes during 10 s of progress-only renewals"
    # And the progress reaches status (the STEP column is lastCheckpoint.step) without any other
    # change: no pod, state or deadline moves while the renewals stop here.
    committed = step - step % 5
    until(
        lambda: (e.status("train").get("lastCheckpoint") or {}).get("step") == committed,
        t,
        15,
        e.explain("train"),
    )

    # A Lease's content changes (an in-process restart reported): the pass runs at once.
    t.heartbeats["train-n1-a0"] = contract.Heartbeat(
        state=contract.PodState.IN_PROCESS_RESTARTING, in_process_restarts=1, step=step
    )
    until(lambda: e.status("train").get("reason") == reasons.IN_PROCESS_RESTART, t, 20, e.explain("train"))

    # A pod goes silent: the pass runs at its heartbeat deadline and replaces it.
    t.heartbeats["train-n1-a0"] = contract.Heartbeat(state=contract.PodState.TRAINING, in_process_restarts=1)
    t.silent.add("train-n0-a0")
    until(
        lambda: "train-n0-a1" in {p.metadata.name for p in e.workers("train").values()},
        t,
        30,
        e.explain("train"),
    )

    # The job's spec changes (suspend): the pass runs at once.
    e.rtj.patch(e.namespace, "train", {"spec": {"suspend": True}})
    until(lambda: not e.workers("train"), t, 30, e.explain("train"))


def test_time_based_rules_wake_the_pass_at_their_own_deadline(env: Callable[..., OperatorEnv]) -> None:
    """The rules that wait for a time, not a change, publish when they fire (Decision.due): with a
    10-minute resync, a pod that never heartbeats is replaced at its startup deadline, and a finished
    job is deleted when its TTL ends, each seconds after, not at the resync."""
    e = env(nodes=3, RTJ_RECONCILE_INTERVAL_SECONDS="600")
    ft = {"heartbeatIntervalSeconds": 2, "heartbeatTimeoutSeconds": 6, "startupTimeoutSeconds": 8}
    e.create_job("train", 2, faultTolerance=ft, ttlSecondsAfterFinished=5)
    t = e.trainers("train")
    t.silent.add("train-n1-a0")  # never heartbeats: silent from its start
    until(
        lambda: "train-n1-a1" in {p.metadata.name for p in e.workers("train").values()},
        t,
        60,
        e.explain("train"),
    )
    assert slot_state(e, "train", 1).get("lastFaultReason") == reasons.STARTUP_TIMEOUT

    until(running(e, "train", 2), t, 60, e.explain("train"))
    for pod in e.workers("train").values():
        end_pod(e.core, e.namespace, pod.metadata.name, 0)
    until(lambda: e.status("train").get("state") == "Succeeded", t, 30, e.explain("train"))
    until(lambda: deleted(e, "train"), t, 30, "the finished job was not deleted after its 5 s TTL")


def deleted(e: OperatorEnv, job: str) -> bool:
    try:
        e.job(job)
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def slot_state(e: OperatorEnv, job: str, slot: int) -> dict[str, object]:
    return next((s for s in every_slot(e.status(job)) if s["slot"] == slot), {})
