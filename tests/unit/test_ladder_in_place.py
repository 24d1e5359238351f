"""rtj.ladder.in_place (level 2b, issue 28): where a pod can restart in place (every node the job's
placement selects declares the kubelet feature), the pods built with the restart rule, and an
in-place restart counted once, no pod replaced, its peers' in-job restarts its echoes."""

from __future__ import annotations

import dataclasses

import pytest
from ladder_testkit import NOW, hb, make_job, observe, running_job
from rtj import contract, reasons
from rtj.api.spec_pods import INSTANCE_TYPE_LABEL
from rtj.builders import IN_PLACE_RESTART_RULE, worker_pod
from rtj.ladder import CreateWorkerPod, DeletePod, decide, in_place
from rtj.ladder.observe import ContainerObs, NodeObs, Observed

pytestmark = pytest.mark.unit

FEATURE = contract.RESTART_ALL_CONTAINERS_FEATURE
JOB = make_job().nodes(2).obj()
P5 = ((INSTANCE_TYPE_LABEL, JOB.spec.placement.instance_type),)


def node(name: str, declares: bool = True, labels: tuple[tuple[str, str], ...] = P5, **kw: object) -> NodeObs:
    return NodeObs(
        name=name,
        ready="True",
        labels=labels,
        declared_features=frozenset({FEATURE} if declares else ()),
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("job", "nodes", "available", "words"),
    [
        pytest.param(JOB, [node("a"), node("b")], True, "all 2 nodes", id="every-node-declares"),
        pytest.param(
            JOB, [node("a"), node("b", declares=False)], False, "1 of 2 nodes", id="one-node-lacks-it"
        ),
        pytest.param(
            JOB,
            [node("a"), node("cpu", declares=False, labels=((INSTANCE_TYPE_LABEL, "m5.large"),))],
            True,
            "all 1 nodes",
            id="nodes-the-placement-does-not-select-do-not-count",
        ),
        pytest.param(
            JOB,
            [node("a"), node("b", declares=False, unschedulable=True)],
            True,
            "all 1",
            id="cordoned-ignored",
        ),
        pytest.param(JOB, [], False, "no schedulable node", id="no-node-yet"),
        pytest.param(
            make_job().ft(maxInPlaceRestarts=0).obj(), [node("a")], False, "maxInPlaceRestarts is 0", id="off"
        ),
    ],
)
def test_support(job: object, nodes: list[NodeObs], available: bool, words: str) -> None:
    got = in_place.support(job, nodes)  # type: ignore[arg-type]
    assert got.available is available
    assert words in got.message


def test_a_pod_with_a_budget_carries_the_rule_and_the_env_one_without_carries_neither() -> None:
    with_rule = worker_pod(JOB, 0, 0, "Initial", in_place_restarts=2)["spec"]["containers"][0]
    assert with_rule["restartPolicy"] == "Never"
    assert with_rule["restartPolicyRules"] == [IN_PLACE_RESTART_RULE]
    assert IN_PLACE_RESTART_RULE["exitCodes"]["values"] == [contract.ExitCode.RESTART_IN_PLACE]
    env = {e["name"]: e.get("value") for e in with_rule["env"]}
    assert env[contract.ENV_MAX_IN_PLACE_RESTARTS] == "2"
    plain = worker_pod(JOB, 0, 0, "Initial")["spec"]["containers"][0]
    assert "restartPolicyRules" not in plain and "restartPolicy" not in plain
    assert contract.ENV_MAX_IN_PLACE_RESTARTS not in {e["name"] for e in plain["env"]}


def _with_nodes(observed: Observed, *nodes: NodeObs) -> Observed:
    return dataclasses.replace(observed, all_nodes=nodes)


def test_new_pods_get_the_budget_only_where_every_node_declares_the_feature() -> None:
    new_job = make_job().nodes(2).obj()
    d = decide(new_job, _with_nodes(observe().obj(), node("a"), node("b")), NOW)
    creates = [a for a in d.actions if isinstance(a, CreateWorkerPod)]
    assert [a.in_place_restarts for a in creates] == [2, 2]
    assert d.status.in_place_restart is not None and d.status.in_place_restart.available
    d = decide(new_job, _with_nodes(observe().obj(), node("a"), node("b", declares=False)), NOW)
    assert [a.in_place_restarts for a in d.actions if isinstance(a, CreateWorkerPod)] == [0, 0]
    assert d.status.in_place_restart is not None and "do not declare" in d.status.in_place_restart.message


def _restarted_in_place(restart_count: int, exit_code: int, reason: str = "") -> Observed:
    """Slot 0's trainer container restarted `restart_count` times, its last run ending `exit_code`;
    its peer's launcher restarted its workers once when slot 0's left the rendezvous."""
    trainer = ContainerObs(
        name=contract.TRAINER_CONTAINER,
        restart_count=restart_count,
        exit_code=exit_code,
        terminated_reason=reason,
    )
    peer_fault = {
        "severity": "Soft",
        "reason": "PeerFailure",
        "message": "peer left",
        "time": NOW.isoformat(),
    }
    return (
        observe()
        .rdzv()
        .worker(0, containers=(trainer,))
        .lease("train-n0-a0", 2.0, hb("Starting"))
        .worker(1)
        .lease("train-n1-a0", 1.0, hb("InJobRestarting", ij=1, fault=peer_fault))
        .obj()
    )


def test_an_in_place_restart_is_one_incident_no_pod_replaced_and_the_peers_restart_is_its_echo() -> None:
    d = decide(running_job().obj(), _restarted_in_place(1, contract.ExitCode.RESTART_IN_PLACE), NOW)
    st = d.status
    assert d.actions == []  # nothing created or deleted
    assert (st.restarts.in_place, st.restarts.in_job, st.restarts.pod_reschedules) == (1, 0, 0)
    assert [e.reason for e in d.events] == [reasons.IN_PLACE_RESTART, reasons.IN_JOB_RESTART]
    incident = st.incidents[-1]
    assert (incident.action, incident.level, incident.slot) == ("RestartedInPlace", reasons.LEVEL_IN_PLACE, 0)
    assert incident.pods == 2  # the peer's in-job restart is part of it
    slot0 = st.node_slots[0]
    assert (slot0.in_place_restarts, slot0.recovering_level) == (1, reasons.LEVEL_IN_PLACE)
    # The next pass sees the same restart count: nothing counted again.
    again = decide(running_job().obj().model_copy(update={"status": st}), _restarted_in_place(1, 76), NOW)
    assert again.status.restarts.in_place == 1


def test_an_in_place_restart_after_an_oom_of_the_containers_own_limit_fails_the_job_blaming_no_node() -> None:
    # Ranks OOM-killed by the container's limit spent the in-job budget: restarting in place would
    # only repeat it (the job's sizing), as a Failed OOMKilled pod fails the job.
    observed = _restarted_in_place(1, contract.ExitCode.RESTART_IN_PLACE, "OOMKilled")
    d = decide(running_job().obj(), observed, NOW)
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", reasons.CONTAINER_OOM_KILLED)
    assert "no node is blamed" in failed.message
    assert d.status.restarts.in_place == 0 and not d.status.quarantined_nodes
    assert not [a for a in d.actions if isinstance(a, CreateWorkerPod)]


def test_both_pods_restarting_in_place_for_one_fault_are_one_incident() -> None:
    # Every launcher restarts its workers on every fault, so one fault can spend both budgets at once.
    trainer = ContainerObs(
        name=contract.TRAINER_CONTAINER, restart_count=1, exit_code=contract.ExitCode.RESTART_IN_PLACE
    )
    observed = (
        observe()
        .rdzv()
        .worker(0, containers=(trainer,))
        .lease("train-n0-a0", 2.0, hb("Starting"))
        .worker(1, containers=(trainer,))
        .lease("train-n1-a0", 2.0, hb("Starting"))
        .obj()
    )
    d = decide(running_job().obj(), observed, NOW)
    st = d.status
    assert (st.restarts.in_place, st.restarts.in_job, st.restarts.pod_reschedules) == (1, 0, 0)
    assert [i.action for i in st.incidents] == ["RestartedInPlace"] and st.incidents[-1].pods == 2
    assert [s.in_place_restarts for s in st.node_slots] == [1, 1]
    assert [e.reason for e in d.events].count(reasons.IN_PLACE_RESTART) == 2  # one per pod
    assert d.actions == []


def test_a_container_restart_for_another_exit_is_not_counted_as_in_place() -> None:
    d = decide(running_job().obj(), _restarted_in_place(1, 1), NOW)
    assert d.status.restarts.in_place == 0
    assert d.status.node_slots[0].in_place_restarts == 1  # the baseline follows the count


def test_a_failed_pod_that_asked_for_an_in_place_restart_is_replaced() -> None:
    observed = (
        observe().running(2).worker(0, phase="Failed", exit_code=contract.ExitCode.RESTART_IN_PLACE).obj()
    )
    d = decide(running_job().obj(), observed, NOW)
    assert d.status.node_slots[0].last_fault_reason == reasons.LAUNCHER_BUDGET_EXHAUSTED
    assert d.status.restarts.pod_reschedules == 1


def _said_restarting_in_place(age: float) -> Observed:
    """Slot 0's last heartbeat, `age` seconds ago, said its container restarts in place."""
    fault = {
        "severity": "Soft",
        "reason": contract.FaultReason.RESTARTING_IN_PLACE.value,
        "message": "in-job budget spent; in-place restart 1 of 2",
        "time": NOW.isoformat(),
    }
    return (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", age, hb("InJobRestarting", ij=1, fault=fault))
        .worker(1)
        .lease("train-n1-a0", 1.0, hb())
        .obj()
    )


def test_a_pod_restarting_in_place_is_silent_like_a_start_not_a_lost_heartbeat() -> None:
    # The old container's last heartbeat said it restarts in place: until the new container's first
    # heartbeat, the bound is startupTimeoutSeconds (600 s), not heartbeatTimeoutSeconds (60 s).
    job = running_job().ft(heartbeatTimeoutSeconds=60, startupTimeoutSeconds=600).obj()
    d = decide(job, _said_restarting_in_place(120.0), NOW)
    assert not [a for a in d.actions if isinstance(a, DeletePod | CreateWorkerPod)], d.actions
    assert d.status.restarts.pod_reschedules == 0
    # One that never comes back is replaced at the start's bound, saying so.
    late = decide(job, _said_restarting_in_place(601.0), NOW)
    assert [a.name for a in late.actions if isinstance(a, DeletePod)] == ["train-n0-a0"]
    assert late.status.node_slots[0].last_fault_reason == reasons.STARTUP_TIMEOUT
    assert any("restarts in place" in e.message for e in late.events), [e.message for e in late.events]


def test_a_restart_the_kubelet_reports_as_restarting_all_containers_is_counted_in_place() -> None:
    # Kubernetes 1.37 removes the old containers: their last run reads RestartingAllContainers,
    # exit 137, not the 76 that asked for it.
    observed = _restarted_in_place(1, 137, contract.RESTARTING_ALL_CONTAINERS_REASON)
    d = decide(running_job().obj(), observed, NOW)
    assert (d.status.restarts.in_place, d.status.restarts.pod_reschedules) == (1, 0)
    assert d.actions == []


def test_a_pod_reporting_its_ranks_oom_killed_by_its_limit_fails_the_job_naming_it() -> None:
    fault = {
        "severity": "Permanent",
        "reason": contract.FaultReason.CONTAINER_OOM_KILLED.value,
        "message": "ft_launcher exited with -9: the kernel killed 2 process(es) of the container",
        "time": NOW.isoformat(),
    }
    observed = (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1.0, hb("InJobRestarting", fault=fault))
        .worker(1)
        .lease("train-n1-a0", 1.0, hb())
        .obj()
    )
    job = running_job().spec(resources={"memory": "200Mi"}).obj()
    d = decide(job, observed, NOW)
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert (failed.status, failed.reason) == ("True", reasons.CONTAINER_OOM_KILLED)
    assert "(200Mi)" in failed.message and "no node is blamed" in failed.message
    assert not d.status.quarantined_nodes and d.status.restarts.pod_reschedules == 0
