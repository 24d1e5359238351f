"""The heartbeat budget against the real API server (rtj.ladder.heartbeat_budget, issue 30): under a
budget of 1 Lease write/s for all jobs, each new job's pods are created with the period that keeps the
jobs' worker pods within it (status.heartbeatIntervalSeconds shows it, the pods' TrainerConfig carries
it), and a job whose heartbeatTimeoutSeconds does not allow that period runs at a third of its timeout
with condition HeartbeatBudgetExceeded and a Warning Event naming the budget, the pods and the period."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client
from operator_harness import OperatorEnv, condition, events, running, until
from rtj import contract, reasons

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def pod_periods(e: OperatorEnv, job: str) -> dict[str, int]:
    """Each live worker pod's renew period, as its TrainerConfig tells the heartbeat agent."""
    periods = {}
    for slot, pod in e.workers(job).items():
        env = {v.name: v.value for v in pod.spec.containers[0].env or []}
        config = contract.TrainerConfig.from_env(env[contract.ENV_TRAINER_CONFIG])
        periods[f"n{slot}"] = config.heartbeat_interval_seconds
    return periods


def test_new_pods_get_the_period_of_the_budget_and_a_bound_that_binds_is_shown(
    env: Callable[..., OperatorEnv],
) -> None:
    e = env(nodes=7, RTJ_HEARTBEAT_WRITES_PER_SECOND="1")  # one node per pod: 2 + 3 + 2
    beating = []

    def beat_all() -> None:
        for t in beating:
            t.beat()

    def wait(predicate: Callable[[], object], timeout: float, job: str) -> object:
        """until(), renewing every job's Leases on each poll."""
        return until(lambda: beat_all() or predicate(), None, timeout, e.explain(job))

    # Alone: 2 workers at 1 write/s need 2 s (the spec asks for 1 s).
    e.create_job("first", 2, faultTolerance={"heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 30})
    beating.append(e.trainers("first"))
    until(running(e, "first", 2), beating[0], 90, e.explain("first"))
    assert e.status("first").get("heartbeatIntervalSeconds") == 2
    assert pod_periods(e, "first") == {"n0": 2, "n1": 2}

    # A second job of 3: 5 workers in all, so its pods renew every 5 s (bound 30 / 3 = 10 s).
    e.create_job("second", 3, faultTolerance={"heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 30})
    beating.append(e.trainers("second"))
    wait(running(e, "second", 3), 90, "second")
    assert e.status("second").get("heartbeatIntervalSeconds") == 5
    assert pod_periods(e, "second") == {"n0": 5, "n1": 5, "n2": 5}
    assert (condition(e.job("second"), reasons.HEARTBEAT_BUDGET_EXCEEDED) or {}).get("status") != "True"
    # The first job's next pass shows the period its next pods get; its running pods keep theirs.
    wait(lambda: e.status("first").get("heartbeatIntervalSeconds") == 5, 60, "first")
    assert pod_periods(e, "first") == {"n0": 2, "n1": 2}

    # A third whose 6 s timeout allows at most 2 s, where 7 workers need 7 s: it runs at 2 s, and says so.
    e.create_job("third", 2, faultTolerance={"heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 6})
    beating.append(e.trainers("third"))
    wait(running(e, "third", 2), 90, "third")
    assert e.status("third").get("heartbeatIntervalSeconds") == 2
    assert pod_periods(e, "third") == {"n0": 2, "n1": 2}
    exceeded = condition(e.job("third"), reasons.HEARTBEAT_BUDGET_EXCEEDED) or {}
    assert (exceeded.get("status"), exceeded.get("reason")) == ("True", reasons.HEARTBEAT_BUDGET_EXCEEDED)
    message = exceeded.get("message", "")
    for part in (
        "1 Lease writes/s",
        "7 worker pods",
        "7s",
        "heartbeatTimeoutSeconds=6",
        "2 pods",
        "every 2s",
    ):
        assert part in message, (part, message)

    def warned() -> list[client.CoreV1Event]:
        return [
            ev
            for ev in events(e.core, e.namespace, "third")
            if ev.reason == reasons.HEARTBEAT_BUDGET_EXCEEDED
        ]

    found = wait(warned, 30, "third")
    assert [(ev.type, ev.message) for ev in found] == [("Warning", message)]

    # The other two jobs are suspended (no pods, no share): 2 workers need 2 s, within the bound.
    for name in ("first", "second"):
        e.rtj.patch(e.namespace, name, {"spec": {"suspend": True}})
    beating[:2] = []

    def met() -> bool:
        return (condition(e.job("third"), reasons.HEARTBEAT_BUDGET_EXCEEDED) or {}).get("status") == "False"

    wait(met, 60, "third")
    assert (
        condition(e.job("third"), reasons.HEARTBEAT_BUDGET_EXCEEDED)["reason"] == reasons.HEARTBEAT_BUDGET_MET
    )
