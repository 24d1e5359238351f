"""The fault matrix, end to end: real operator, real trainer processes (ft_launcher, gloo, FSDP2,
checkpoints) on the local cluster, one test per row. Each asserts the ladder level that handled the
fault, the reason, the counters, that no committed checkpoint is lost or goes backwards, and the end
state. Faults come from the trainer's own hook (`--fault-inject`, fired once per job at a step) or
from outside (the node agent's node death, a job deletion).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest
from e2e_helpers import (
    FAULT_MID_RUN_STEPS,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    BlameRow,
    JobRun,
    all_training,
    failed,
    node_record,
    nodes_schedulable,
    only_on_kubelet_nodes,
    operator_leader,
    succeeded,
)
from kubernetes.client.rest import ApiException
from rtj.api.status_slots import every_slot
from rtj.builders import HOSTNAME_LABEL
from rtj.contract import (
    LABEL_JOB,
    RESTART_ALL_CONTAINERS_FEATURE,
    RESTARTING_ALL_CONTAINERS_REASON,
    ExitCode,
)
from rtj.reasons import IN_PLACE_RESTART
from rtj_local import node_kinds
from rtj_local.rawapi import MERGE
from rtj_local.train_log import TRAIN_LOG_SUBDIR
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

START = 240.0  # scheduling, cold `import torch` x ranks, rendezvous: slow on 2 busy cores
FINISH = 300.0


def finished(snap) -> bool:
    return succeeded(snap) or failed(snap)


def assert_succeeded(job: JobRun) -> None:
    snap = job.wait(finished, FINISH, "job to finish")
    assert succeeded(snap), f"job ended Failed: {snap.condition('Failed')}"


#: One job, three soft faults in turn (each fires once per job, at a step past the previous fault's
#: resume point): the rows below examine what each one caused, between it and the next. Steps of
#: SOFT_STEP_SECONDS put more than 10 s between faults, so each fault's restarts are on the job's
#: status before the next fault fires (the window ends there, by the ranks' clocks).
SOFT_FAULTS = "exception:1:8;sigkill:1:20;hang:1:32"
SOFT_STEP_SECONDS = 1.0


@pytest.fixture(scope="module")
def soft_faults(module_jobs) -> tuple[JobRun, dict[str, str]]:
    job = module_jobs.start("soft", faults=SOFT_FAULTS, steps=45, interval=5, min_step_time=SOFT_STEP_SECONDS)
    first = job.wait(all_training, START, "both pods training")
    pods = job.worker_pods(first)
    job.wait(finished, 2 * FINISH, "job to finish")
    return job, pods


def assert_soft_run_ok(job: JobRun, pods: dict[str, str]) -> None:
    last = job.history[-1]
    assert succeeded(last), f"job ended {last.condition('Failed')}"
    assert last.restarts["podReschedules"] == 0
    assert job.worker_pods(last) == pods, "pods must be untouched (same names and UIDs)"
    job.assert_checkpoints_never_lost_or_backwards()


def test_exception_in_a_rank_is_restarted_in_process_pods_untouched(soft_faults) -> None:
    job, pods = soft_faults
    assert job.fault_fired("exception-1-8")
    delta, reasons = job.window("exception-1-8")
    assert delta["inProcess"] >= 1 and delta["inJob"] == 0 and delta["podReschedules"] == 0, delta
    assert "InProcessRestart" in reasons
    assert_blamed_nothing(job, "rank exception", "exception-1-8", "RestartedInProcess")
    assert_soft_run_ok(job, pods)
    cost = job.steps_lost("exception-1-8", "InProcess")
    assert cost is not None and cost.lost == 0, f"the state kept in memory loses nothing: {cost}"


def test_sigkill_of_a_rank_is_an_in_job_restart_pods_untouched(soft_faults) -> None:
    job, pods = soft_faults
    assert job.fault_fired("sigkill-1-20")
    delta, reasons = job.window("sigkill-1-20")
    assert delta["inJob"] >= 1 and delta["podReschedules"] == 0, delta
    assert "InJobRestart" in reasons
    # The Event names this fault, not the exception the pod recovered from before (a SIGKILLed rank
    # reports nothing; its pod's heartbeat agent says how it ended).
    restarts = job.events_about("InJobRestart")
    assert any("RankExited" in t and "killed by SIGKILL while training" in t for t in restarts), restarts
    assert_blamed_nothing(job, "rank SIGKILL", "sigkill-1-20", "RestartedInJob")
    assert_soft_run_ok(job, pods)
    cost = job.steps_lost("sigkill-1-20", "InJob")
    # Resumed from the newest persisted checkpoint (interval 5; one save may be skipped while the
    # writer drains): fewer than two intervals lost.
    assert cost is not None and cost.lost < 10, cost


def test_hang_of_a_rank_is_restarted_below_the_pod_level_pods_untouched(soft_faults) -> None:
    job, pods = soft_faults
    assert job.fault_fired("hang-1-32")
    delta, reasons = job.window("hang-1-32")
    assert delta["podReschedules"] == 0, delta
    assert reasons & {"InProcessRestart", "InJobRestart"}
    # The pods restarted (their own counts). status.restarts counts incidents, and a restart whose
    # pod reports a collateral cause (PeerFailure, RankStopped) is never one: the hung rank cannot
    # report, its launcher stops it (RankStopped) and its peer times out on it (PeerFailure), so
    # this incident may add nothing there (issue 25's rule, docs/fault-classes.md).
    assert job.pod_restarts_in_window("hang-1-32") >= 1, delta
    assert_soft_run_ok(job, pods)
    assert job.steps_lost("hang-1-32", "InProc/InJob") is not None, "no resume seen after the hang"


def assert_blamed_nothing(job: JobRun, fault: str, key: str, action: str) -> None:
    """Injected fault `key`'s blame row: `action` before the next fault, no node quarantined."""
    row = job.blame(fault, job.fault_time(key), action, until=job.next_fault_time(key))
    assert row.right_action and not row.quarantined, row


def assert_blamed(row: BlameRow) -> None:
    assert row.right_action and not row.false_quarantines and not row.missed_quarantines, row


def slot_pod(snap, slot: int) -> dict:
    return next(s for s in every_slot(snap.status) if s.get("slot") == slot)


def slot_of_rank(job: JobRun, snap, rank: int) -> int:
    """The node slot whose pod runs global rank `rank` (rendezvous decides: read the ranks' env)."""
    agent = job.stack.agent
    for slot in every_slot(snap.status):
        procs = agent.pod_processes(NAMESPACE, slot["pod"])
        if any(p.env.get("RANK") == str(rank) for p in procs):
            return slot["slot"]
    raise AssertionError(f"no pod of {job.name} runs rank {rank}")


def in_place_restart_status(snap) -> dict:
    return snap.status.get("inPlaceRestart") or {}


def test_launcher_budget_exhausted_replaces_that_pod_and_the_job_continues(run_job, e2e_stack) -> None:
    # Budget 1: the second SIGKILL of rank 1 exhausts its pod's launcher; the pod fails (exit 70).
    # Where the pod could restart in place instead (kubelet nodes declare the feature) the job turns
    # that off (maxInPlaceRestarts 0): a cluster without the feature behaves so. The node agent's
    # nodes declare no feature (no kubelet): the job's status says so and the pod is replaced.
    kubelet = e2e_stack.kind == node_kinds.KUBELET
    job = run_job(
        "budget",
        faults="sigkill:1:12;sigkill:1:14",
        steps=40,
        interval=5,
        fault_tolerance={
            "maxInJobRestarts": 1,
            "maxNoProgressCycles": 10,
            **({"maxInPlaceRestarts": 0} if kubelet else {}),
        },
    )
    first = job.wait(all_training, START, "both pods training")
    in_place = in_place_restart_status(first)
    why = "maxInPlaceRestarts is 0" if kubelet else f"do not declare {RESTART_ALL_CONTAINERS_FEATURE}"
    assert in_place.get("available") is False and why in in_place.get("message", ""), in_place
    slot = slot_of_rank(job, first, 1)
    before = slot_pod(first, slot)
    other = slot_pod(first, 1 - slot)
    replaced = job.wait(
        lambda s: slot_pod(s, slot).get("attempt", 0) > before.get("attempt", 0), 240, f"slot {slot} replaced"
    )
    assert slot_pod(replaced, slot)["pod"] != before["pod"]
    assert_succeeded(job)
    last = job.history[-1]
    if "PodsFailedTogether" in job.event_reasons():
        # Every launcher restarts its workers on every fault, so every pod's budget can run out in
        # the same instant (restarts take ~1 s now): the operator then recovers the job as a whole,
        # one job-level restart, no pod budget spent, no node quarantined.
        assert last.restarts["job"] >= 1, last.restarts
    else:
        assert last.restarts["podReschedules"] >= 1, last.restarts
    # The reason is LauncherBudgetExhausted, as the pod's exit code (70) says or, when its heartbeat
    # reported it first, PodReportedHardFault naming it.
    assert job.events_about("LauncherBudgetExhausted"), sorted(job.event_reasons())
    spent = job.fault_time("sigkill-1-14")
    assert_blamed(job.blame("launcher budget spent", spent, ("Replaced", "ReplacedAtJobLevel")))
    # An exhausted launcher is no evidence against its node (issue 25): nothing quarantined; the
    # fault is recorded on the node instead (another job's fault there would make the case).
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    records = {n: node_record(job.raw, n) for n in job.stack.nodes}
    assert not [n for n, r in records.items() if r.taint], records
    assert "NodeQuarantined" not in job.event_reasons(), sorted(job.event_reasons())
    if "PodsFailedTogether" not in job.event_reasons():
        recorded = [f for f in records[before["node"]].faults if f.job == f"{NAMESPACE}/budget"]
        assert recorded, f"the fault is recorded on node {before['node']}: {records[before['node']]}"
    # Where the pod's heartbeat reported the exhausted launcher, the operator replaces it at once and
    # may delete it before it exits; otherwise its exit code says so: 70, as the timeline saw it or
    # (when the operator replaced the pod between two polls) as the operator's Event quotes it.
    exit_codes = {s.pods[before["pod"]]["exit_code"] for s in job.history if before["pod"] in s.pods}
    about = job.events_about(before["pod"])
    quoted = [t for t in about if "exit code 70" in t]
    reported = [t for t in about if "reported LauncherBudgetExhausted: ft_launcher exited" in t]
    assert 70 in exit_codes or quoted or reported, f"the exhausted pod exits 70, saw {exit_codes}, {about}"
    job.assert_checkpoints_never_lost_or_backwards()
    print(f"slot {1 - slot}: {other['pod']} -> {slot_pod(last, 1 - slot)['pod']} (the other slot)")
    assert job.steps_lost("sigkill-1-14", "Pod") is not None, "no resume seen after the pod's replacement"


#: Memory snapshots of the in-place row: every 4 steps (0.2 s each), persisted checkpoints every 20.
IN_PLACE_SNAPSHOT_INTERVAL = 4


@only_on_kubelet_nodes
def test_launcher_budget_spent_on_a_healthy_node_restarts_the_pod_in_place_from_memory(run_job) -> None:
    # As the row above, with the pods' default in-place budget (maxInPlaceRestarts 2) on nodes whose
    # kubelet restarts every container of a pod in place (RestartAllContainers): the launcher whose
    # budget is spent exits 76, and its pod comes back with the same UID, IP, node and /dev/shm.
    job = run_job(
        "inplace",
        faults="sigkill:1:30;sigkill:1:34",
        steps=80,
        interval=20,
        checkpoint={"memorySnapshotIntervalSteps": IN_PLACE_SNAPSHOT_INTERVAL},
        fault_tolerance={"maxInJobRestarts": 1, "maxNoProgressCycles": 10},
    )
    first = job.wait(all_training, START, "both pods training")
    in_place = in_place_restart_status(first)
    assert in_place.get("available") is True, in_place
    slot = slot_of_rank(job, first, 1)
    before = slot_pod(first, slot)
    pod = first.pods[before["pod"]]
    job.wait(lambda s: s.restarts["inPlace"] >= 1, 240, "an in-place restart")
    assert_succeeded(job)
    last = job.history[-1]
    after = last.pods.get(before["pod"])
    assert after is not None, f"pod {before['pod']} was replaced: {sorted(last.pods)}"
    same = {k: (pod[k], after[k]) for k in ("uid", "node", "ip")}
    assert all(a == b for a, b in same.values()), f"the same pod, node and IP: {same}"
    # The kubelet removes the old containers: it reports their last run as RestartingAllContainers
    # (Kubernetes 1.37), not the exit code 76 that asked for it.
    assert after["container_restarts"] >= 1, after
    assert after["last_reason"] == RESTARTING_ALL_CONTAINERS_REASON or (
        after["last_exit_code"] == ExitCode.RESTART_IN_PLACE
    ), after
    # One incident (both launchers may spend their budgets on the same fault), no pod replaced,
    # nothing quarantined, the pod's own restart count on its slot.
    assert last.restarts["inPlace"] == 1, last.restarts
    assert last.restarts["podReschedules"] == 0 and last.restarts["job"] == 0, last.restarts
    assert slot_pod(last, slot).get("inPlaceRestarts", 0) >= 1, slot_pod(last, slot)
    assert IN_PLACE_RESTART in job.event_reasons(), sorted(job.event_reasons())
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert_blamed(
        job.blame("launcher budget spent, in place", job.fault_time("sigkill-1-34"), "RestartedInPlace")
    )
    # Resumed from the memory snapshots its /dev/shm kept: at most one snapshot interval lost (the
    # persisted tier is 20 steps apart).
    cost = job.steps_lost("sigkill-1-34", "InPlace")
    assert cost is not None and "local" in cost.sources, cost
    assert cost.lost <= IN_PLACE_SNAPSHOT_INTERVAL, cost
    job.assert_checkpoints_never_lost_or_backwards()


#: Heartbeat timeout of the node-death rows: longer than the node lifecycle controller takes to see
#: a node's Lease lapse (the agent's 20 s Lease, --node-monitor-grace-period 20 s), so that the
#: node's death, not its pods' silence, is what the operator sees first. Silence alone is no evidence
#: against a node (issue 25): replaced on it, the pod's node would not be quarantined.
NODE_DEATH_HEARTBEAT_TIMEOUT = 60


def test_node_death_replaces_the_pod_on_another_node_and_quarantines_the_node(run_job, e2e_stack) -> None:
    job = run_job(
        "nodedeath",
        steps=FAULT_MID_RUN_STEPS,
        interval=10,
        fault_tolerance={"heartbeatTimeoutSeconds": NODE_DEATH_HEARTBEAT_TIMEOUT},
    )
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 10, START, "a checkpoint")
    rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
    victim = next(s for s in every_slot(snap.status) if s["node"] != rdzv_node)
    checkpoint_before = snap.checkpoint_step
    killed_at = time.time()
    killed = e2e_stack.agent.kill_node(victim["node"])
    assert f"{NAMESPACE}/{victim['pod']}" in killed

    def replaced_elsewhere(s) -> bool:
        slot = slot_pod(s, victim["slot"])
        return (
            slot["pod"] != victim["pod"] and slot.get("node") not in ("", victim["node"]) and all_training(s)
        )

    job.wait(replaced_elsewhere, 240, "the dead node's pod replaced on another node and training")
    assert_succeeded(job)
    last = job.history[-1]
    assert last.restarts["podReschedules"] >= 1
    evidence = job.event_reasons() & {"NodeNotReady", "NodeLost"}
    assert evidence, sorted(job.event_reasons())
    assert "HeartbeatTimeout" not in job.event_reasons(), sorted(job.event_reasons())
    assert victim["node"] in (last.status.get("quarantinedNodes") or [])
    # The node's quarantine: the taint's value is the evidence's reason, the record names the job.
    record = node_record(job.raw, victim["node"])
    assert record.taint in evidence, record
    assert record.quarantine is not None and record.quarantine.reason == record.taint, record
    assert [e.job for e in record.quarantine.evidence] == [f"{NAMESPACE}/nodedeath"], record
    assert job.events_about("NodeQuarantined"), sorted(job.event_reasons())
    others = [n for n in job.stack.nodes if n != victim["node"] and node_record(job.raw, n).taint]
    assert not others, f"only the dead node is quarantined: {others}"
    assert_blamed(job.blame("node death", killed_at, "Replaced", quarantined=[victim["node"]]))
    assert (last.checkpoint_step or 0) > (checkpoint_before or 0)
    job.assert_checkpoints_never_lost_or_backwards()
    assert job.steps_lost("node death", "Pod", at=killed_at) is not None, "no resume seen after it"


@pytest.mark.timeout(720)
def test_node_death_with_the_volume_unreadable_resumes_from_the_peer_replica(run_job, e2e_stack) -> None:
    """issue 14, item 3: memory snapshots every 2 steps replicated to the next slot's pod. A node
    dies (its pod's memory with it) and every checkpoint on the volume is unreadable while the job
    recovers (mode 000: the pods run as the trainer's user); the replacement fetches its shard from the peer
    and the job resumes at most one memory interval behind (status.replicaStep shows the replicas)."""
    job = run_job(
        "peer",
        steps=400,
        interval=10,
        checkpoint={"memorySnapshotIntervalSteps": 2, "peerReplica": True},
        # The node's death is seen as such (see NODE_DEATH_HEARTBEAT_TIMEOUT): its node quarantined,
        # the replacement is kept off it.
        fault_tolerance={"heartbeatTimeoutSeconds": NODE_DEATH_HEARTBEAT_TIMEOUT},
    )

    def lease(s, pod: str) -> dict:
        return s.leases.get(pod, {})

    # The pods' Leases (renewed every heartbeat) show the replicas at once; status.replicaStep and
    # status.step follow with the once-a-minute heartbeat-time refresh, too late to time a kill by.
    snap = job.wait(
        lambda s: (
            all_training(s)
            and all((lease(s, slot["pod"]).get("replica") or 0) >= 10 for slot in every_slot(s.status))
        ),
        START,
        "a replica in every pod",
    )
    rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
    victim = next(s for s in every_slot(snap.status) if s["node"] != rdzv_node)
    before = lease(snap, victim["pod"]).get("step") or 0
    # Every checkpoint on the volume unreadable (mode 000: the pods run as the trainer's user, not
    # root); the volume itself stays writable, as the ranks' step logs (this test's instrument) and
    # the fault markers live there too.
    hidden = {
        p: p.stat().st_mode
        for p in job.checkpoint_dir.iterdir()
        if p.name != TRAIN_LOG_SUBDIR and not p.name.startswith(".fault-")
    }
    assert hidden, "nothing persisted to hide"
    for p in hidden:
        p.chmod(0)
    try:
        killed_at = time.time()
        killed = e2e_stack.agent.kill_node(victim["node"])
        assert f"{NAMESPACE}/{victim['pod']}" in killed

        def replaced_and_training(s) -> bool:
            pod = slot_pod(s, victim["slot"])["pod"]
            return pod != victim["pod"] and all_training(s) and (lease(s, pod).get("step") or 0) > before + 4

        job.wait(replaced_and_training, 240, "the dead node's pod replaced and training again")
        cost = job.steps_lost("node death, no volume", "Pod", at=killed_at)
    finally:
        for p, mode in hidden.items():
            with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
                p.chmod(mode)
    assert cost is not None, "no resume seen after the node death"
    assert cost.sources == ("peer",), cost
    assert cost.lost <= 2 * 2, cost  # the newest snapshot or the one before (in flight when it died)
    assert_succeeded(job)
    assert_blamed(job.blame("node death, no volume", killed_at, "Replaced", quarantined=[victim["node"]]))
    shown = [s.status.get("replicaStep") for s in job.history]
    assert any((step or 0) >= 10 for step in shown), f"status.replicaStep never shown: {shown}"


def test_rendezvous_pod_killed_is_recovered_at_job_level(run_job, e2e_stack) -> None:
    """issue 13, case 1: the rendezvous pod dies and every worker's launcher fails. Before: each
    worker a pod reschedule with its healthy node quarantined; Failed/PodRescheduleBudgetExhausted
    (here maxPodReschedules 2: the rendezvous pod and two workers would be 3). Now the rendezvous
    pod is recreated as one job restart and each worker pod starts its launcher again inside
    itself: the worker pods are untouched."""
    job = run_job("rdzvkill", steps=FAULT_MID_RUN_STEPS, interval=10)
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 10, START, "a checkpoint")
    checkpoint_before = snap.checkpoint_step
    pods = job.worker_pods(snap)
    procs = e2e_stack.agent.pod_processes(NAMESPACE, "rdzvkill-rdzv")
    assert procs, "the rendezvous pod runs"
    killed_at = time.time()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    assert_succeeded(job)
    last = job.history[-1]
    # The rendezvous pod's loss is one job restart; no pod budget spent.
    assert (last.restarts["podReschedules"], last.restarts["job"]) == (0, 1), last.restarts
    assert job.worker_pods(last) == pods, "worker pods must be untouched (same names and UIDs)"
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert_blamed(job.blame("rendezvous pod killed", killed_at, "RecreatedRendezvous"))
    print(f"restarts {last.restarts}; events {sorted(job.event_reasons())}")
    assert (last.checkpoint_step or 0) > (checkpoint_before or 0)
    job.assert_checkpoints_never_lost_or_backwards()
    assert job.steps_lost("rendezvous pod", "Job", at=killed_at) is not None, "no resume seen after it"


def test_worker_exiting_0_early_ends_the_job_no_progress_not_a_silent_hang(run_job) -> None:
    """issue 13, case 2: one worker's command returns 0 while the other still trains. Before: 7+
    minutes `Running AllPodsRunning` with the step frozen, no Event. Now the progress watchdog says
    Stalled (condition + Event) after progressTimeoutSeconds and fails the job NoProgress after
    twice that; nothing is rescheduled and no node quarantined (the pods are not at fault)."""
    job = run_job(
        "early0",
        faults="finish:1:15",
        steps=400,
        interval=5,
        fault_tolerance={"progressTimeoutSeconds": 20},
    )
    job.wait(all_training, START, "both pods training")
    last = job.wait(finished, FINISH, "job to finish")
    assert job.fault_fired("finish-1-15")
    assert failed(last), "a job that cannot finish must end, not hang"
    assert (last.condition("Failed") or {}).get("reason") == "NoProgress", last.condition("Failed")
    assert ("Stalled", "Stalled") in job.condition_reasons(), sorted(job.condition_reasons())
    assert job.events_about("Stalled"), sorted(job.event_reasons())
    assert last.restarts["podReschedules"] == 0, last.restarts
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert (last.condition("Degraded") or {}).get("status") != "True", "no stale Degraded on a failed job"
    assert_blamed(job.blame("worker exits 0 early", job.fault_time("finish-1-15"), "Failed"))


def test_deleted_heartbeat_lease_is_recreated_and_nothing_is_replaced(run_job) -> None:
    """issue 13, case 3: a user deletes a healthy pod's heartbeat Lease. Before: the pod was replaced
    and its node quarantined in the same second (StartupTimeout counted from pod start). Now the
    trainer recreates the Lease within its renew period and the operator counts silence from the
    last heartbeat it saw: nothing happens."""
    job = run_job("leasedel", steps=80, interval=10)
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 10, START, "a checkpoint")
    pods = job.worker_pods(snap)
    victim = sorted(pods)[0]
    lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{victim}"
    old_uid = job.raw.request("GET", lease_path)["metadata"]["uid"]
    job.raw.request("DELETE", lease_path)

    def recreated(_snap) -> bool:
        lease = job.raw.get(lease_path)
        return lease is not None and lease["metadata"]["uid"] != old_uid

    job.wait(recreated, 60, "the trainer to recreate its Lease")
    assert_succeeded(job)
    last = job.history[-1]
    assert job.worker_pods(last) == pods, "pods must be untouched (same names and UIDs)"
    assert last.restarts["podReschedules"] == 0, last.restarts
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert not job.event_reasons() & {"HeartbeatTimeout", "StartupTimeout", "NodeQuarantined"}
    job.assert_checkpoints_never_lost_or_backwards()


#: Edits of a running job that would change its world or storage under it, and a word the API
#: server's refusal must contain (the field's name).
WORLD_EDITS = [
    ({"procsPerNode": 2}, "procsPerNode"),
    ({"checkpoint": {"mountPath": "/elsewhere"}}, "checkpoint.mountPath"),
    ({"checkpoint": {"pvc": {"claimName": "other-ckpt"}}}, "checkpoint.pvc"),
    ({"args": ["--steps", "999"]}, "suspend"),
]


def test_editing_what_defines_a_running_job_is_refused_and_training_is_untouched(run_job) -> None:
    """issue 13, case 4: procsPerNode, the checkpoint volume and path were accepted silently and the
    next replacement pod joined with another world size (66 in-process restarts, a healthy node
    quarantined). Now the API server refuses each edit naming the field (CEL transition rules; the
    command, args and env change only with suspend: a whole-job restart), and the job trains on."""
    job = run_job("edit", steps=60, interval=10)
    snap = job.wait(all_training, START, "both pods training")
    pods = job.worker_pods(snap)
    path = f"/apis/training.resilient.dev/v1alpha1/namespaces/{NAMESPACE}/resilienttrainingjobs/edit"
    generation = job.raw.request("GET", path)["metadata"]["generation"]
    for patch, field_name in WORLD_EDITS:
        with pytest.raises(ApiException) as refused:
            job.raw.request("PATCH", path, {"spec": patch}, MERGE)
        assert refused.value.status == 422, (patch, refused.value.status)
        assert field_name in (refused.value.body or ""), (patch, refused.value.body)
    assert job.raw.request("GET", path)["metadata"]["generation"] == generation
    assert_succeeded(job)
    last = job.history[-1]
    assert job.worker_pods(last) == pods, "pods must be untouched (same names and UIDs)"
    assert last.restarts == {**last.restarts, "podReschedules": 0, "inJob": 0}, last.restarts
    job.assert_checkpoints_never_lost_or_backwards()


def test_do_not_restart_exit_code_fails_the_job_and_restarts_nothing(run_job) -> None:
    # Two in-job restarts without a newer checkpoint in between: the trainer stops with 93.
    job = run_job(
        "dnr",
        faults="sigkill:1:12;sigkill:1:14",
        steps=40,
        interval=5,
        fault_tolerance={"maxInJobRestarts": 5, "maxNoProgressCycles": 1},
    )
    first = job.wait(all_training, START, "both pods training")
    pods = job.worker_pods(first)
    last = job.wait(finished, FINISH, "job to finish")
    assert failed(last), "the job must fail"
    assert (last.condition("Failed") or {}).get("reason") == "DoNotRestartExitCode"
    assert_blamed(job.blame("do-not-restart exit", job.fault_time("sigkill-1-14"), "Failed"))
    assert last.restarts["podReschedules"] == 0
    assert set(job.worker_pods(last)) <= set(pods), "no pod may be created after the do-not-restart exit"
    job.assert_checkpoints_never_lost_or_backwards()


@contextlib.contextmanager
def pod_frozen(e2e_stack, pod: str) -> Iterator[None]:
    """Every process of `pod` stopped (SIGSTOP: silent, its heartbeat agent too) for the block; then
    continued, so that they see their end when the pod is deleted."""
    procs = e2e_stack.agent.pod_processes(NAMESPACE, pod)
    assert procs, f"{pod} runs"
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)


def test_pod_budget_exhausted_fails_the_job_and_restarts_nothing(run_job, e2e_stack) -> None:
    # A fault of one pod with no pod budget left: the whole pod hangs (every process stopped, its
    # heartbeat agent too), HeartbeatTimeout. Not a deletion: a pod deleted by someone else is a
    # disruption and spends no budget (issue 25; tests/e2e/test_blame_matrix.py). Not a rank's
    # SIGKILL: with maxInJobRestarts 0 every launcher exits on it within a second, and the operator,
    # seeing both in one pass, rightly recovers the job as a whole (PodsFailedTogether, the
    # launcher-budget row), so which budget ran out would depend on the timing of two polls. The
    # heartbeat timeout (12 s) comes before the peer's rank hang detection (rankHangTimeoutSeconds 20).
    job = run_job(
        "podbudget",
        steps=400,
        interval=5,
        fault_tolerance={"maxInJobRestarts": 0, "maxPodReschedules": 0},
    )
    first = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    pods = job.worker_pods(first)
    victim = sorted(pods)[0]
    stopped_at = time.time()
    with pod_frozen(e2e_stack, victim):
        last = job.wait(finished, FINISH, "job to finish")
    assert failed(last), "the job must fail"
    assert (last.condition("Failed") or {}).get("reason") == "PodRescheduleBudgetExhausted"
    why = job.events_about("PodRescheduleBudgetExhausted")
    assert any(f"pod {victim}: heartbeat silent" in t for t in why), why
    assert last.restarts["podReschedules"] == 0 and last.restarts["job"] == 0, last.restarts
    assert set(job.worker_pods(last)) <= set(pods), "no replacement pod may be created"
    assert not last.status.get("quarantinedNodes"), "silence is no evidence against a node"
    assert_blamed(job.blame("pod hung, no pod budget", stopped_at, "Failed"))
    job.assert_checkpoints_never_lost_or_backwards()


def training_under_two_operators(run_job, raw, name: str, **spec):
    """A job training past a checkpoint, and the one leader of the chart's two operator pods."""
    job = run_job(name, steps=FAULT_MID_RUN_STEPS, interval=5, **spec)
    first = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    leader, operators = operator_leader(raw)
    assert leader and len(operators) == 2, f"one leader of two operator pods: {leader!r}, {operators}"
    return job, first, leader


@only_on_kubelet_nodes
def test_active_operator_killed_during_a_fault_the_standby_replaces_the_silent_pod_only(
    run_job, e2e_stack
) -> None:
    # The chart's two operator pods (one active, one standby on the leader Lease). A worker pod goes
    # silent (every process stopped: HeartbeatTimeout after 12 s) and in the same instant the active
    # operator's pod is deleted with grace 0 (its processes SIGKILLed by their kubelet). The standby
    # takes over, replaces that pod only, and reads no other pod's heartbeat as lost.
    raw = e2e_stack.raw
    job, first, leader = training_under_two_operators(run_job, raw, "failover")
    pods = job.worker_pods(first)
    victim = sorted(pods)[0]
    slot = next(s["slot"] for s in every_slot(first.status) if s.get("pod") == victim)
    stopped_at = time.time()
    with pod_frozen(e2e_stack, victim):
        raw.request(
            "DELETE", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{leader}", {"gracePeriodSeconds": 0}
        )
        replaced = job.wait(
            lambda s: slot_pod(s, slot).get("pod") not in ("", victim), 180, f"slot {slot} replaced"
        )
    victim_node = next(s["node"] for s in every_slot(first.status) if s.get("pod") == victim)
    new_path = f"/api/v1/namespaces/{NAMESPACE}/pods/{slot_pod(replaced, slot)['pod']}"
    new_pod = wait_for(lambda: raw.get(new_path), timeout=60, interval=0.5, message=f"{new_path} created")
    preferred = new_pod["spec"]["affinity"]["nodeAffinity"].get(
        "preferredDuringSchedulingIgnoredDuringExecution"
    )
    new_leader, _ = operator_leader(raw)
    assert new_leader and new_leader != leader, f"the standby took over: {leader} -> {new_leader!r}"
    print(f"leader {leader} -> {new_leader}; slot {slot} replaced at {replaced.t:.1f}s")
    assert_succeeded(job)
    last = job.history[-1]
    assert last.restarts["podReschedules"] == 1 and last.restarts["job"] == 0, last.restarts
    survivor = next(n for n in pods if n != victim)
    assert survivor in job.worker_pods(last), f"the healthy pod {survivor} must be untouched"
    timeouts = [t for t in job.events_about("HeartbeatTimeout") if t.startswith("HeartbeatTimeout:")]
    assert timeouts and all(victim in t for t in timeouts), f"only {victim} timed out: {timeouts}"
    assert not last.status.get("quarantinedNodes"), "silence is no evidence against a node"
    # ... but its node is the slot's suspect: the replacement prefers other nodes (no requirement).
    assert slot_pod(last, slot).get("suspectNode") == victim_node, slot_pod(last, slot)
    elsewhere = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": [victim_node]}
    assert any(elsewhere in term["preference"]["matchExpressions"] for term in preferred), preferred
    assert not node_record(raw, victim_node).taint, "a suspect is neither tainted nor quarantined"
    assert_blamed(job.blame("pod hung, active operator killed", stopped_at, "Replaced"))
    job.assert_checkpoints_never_lost_or_backwards()


@only_on_kubelet_nodes
@pytest.mark.timeout(600)
def test_the_active_operators_node_dies_the_standby_takes_over_and_recovers_the_job(
    run_job, e2e_stack
) -> None:
    # issue 30, item 3: the node running the active operator pod dies (kubelet, containerd and every
    # container SIGKILLed), with whatever of the job ran there. The standby takes the leader Lease
    # once it expires, and the job's pods on the dead node are replaced (NodeNotReady); no healthy
    # pod's heartbeat is read as lost. The node is restarted afterwards (the next rows need it).
    raw = e2e_stack.raw
    # The node-death rows before this one leave their nodes dead (see conftest.KUBELET_NODES): with two
    # of four left, the pods of the operator's node would have nowhere to go. Every node back first.
    e2e_stack.agent.up(len(e2e_stack.agent.node_names()))
    wait_for(
        lambda: nodes_schedulable(raw, e2e_stack.nodes), timeout=120, interval=1.0, message="every node Ready"
    )
    # The node's death, not its pods' silence, is what the operator acts on (as in the node-death
    # rows): a 12 s heartbeat timeout would replace a silent pod before NodeNotReady, the scheduler
    # could put it on the dying node, and NodeNotReady would replace it again.
    job, first, leader = training_under_two_operators(
        run_job, raw, "opnode", fault_tolerance={"heartbeatTimeoutSeconds": NODE_DEATH_HEARTBEAT_TIMEOUT}
    )
    node = raw.get(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{leader}")["spec"]["nodeName"]
    there = [s for s in every_slot(first.status) if s.get("node") == node]
    rdzv_there = any(n.endswith("-rdzv") and p["node"] == node for n, p in first.pods.items())
    killed_at = time.time()
    e2e_stack.agent.kill_node(node)
    try:
        took_over = wait_for(
            lambda: (lambda x: x if x and x != leader else None)(operator_leader(raw)[0]),
            timeout=60,
            interval=0.2,
            message="the standby to take the leader Lease",
        )
        taken = time.time() - killed_at
        for slot in there:
            job.wait(
                lambda s, slot=slot: slot_pod(s, slot["slot"]).get("pod") not in ("", slot["pod"]),
                180,
                f"slot {slot['slot']} (on the dead node) replaced",
            )
        replaced = time.time() - killed_at
        assert_succeeded(job)
        last = job.history[-1]
        lost = {s["pod"] for s in there}
        timeouts = [t for t in job.events_about("HeartbeatTimeout") if t.startswith("HeartbeatTimeout:")]
        assert all(any(p in t for p in lost) for t in timeouts), f"only the dead node's pods: {timeouts}"
        if rdzv_there:  # a job-level recovery: the workers there are pods of it, no pod budget
            assert last.restarts["job"] == 1, last.restarts
            expected: tuple[str, ...] = ("RecreatedRendezvous", "ReplacedAtJobLevel")
        else:
            assert last.restarts["podReschedules"] == len(there), last.restarts
            expected = ("Replaced",) if there else ()
        healthy = {s["pod"] for s in every_slot(first.status)} - lost
        assert healthy <= set(job.worker_pods(last)), f"the healthy pods {healthy} must be untouched"
        row = job.blame(
            "active operator's node dies", killed_at, expected, quarantined=[node] if there else []
        )
        assert row.right_action and not row.false_quarantines, row
        assert rdzv_there or not row.missed_quarantines, row  # a job-level recovery may not quarantine
        job.assert_checkpoints_never_lost_or_backwards()
        print(
            f"operator node {node} killed: {took_over} leader after {taken:.1f}s; "
            f"{len(there)} worker(s) there (rendezvous pod: {rdzv_there}), replaced after {replaced:.1f}s"
        )
    finally:
        e2e_stack.agent.up(len(e2e_stack.agent.node_names()))


def test_job_deleted_mid_run_removes_every_child(run_job, e2e_stack) -> None:
    job = run_job("deleted", steps=400)
    snap = job.wait(lambda s: all_training(s) and bool(s.leases), START, "training")
    pods = list(snap.pods)
    raw = job.raw
    raw.request(
        "DELETE",
        f"/apis/training.resilient.dev/v1alpha1/namespaces/{NAMESPACE}/resilienttrainingjobs/deleted",
    )

    def children_gone() -> bool:
        ns = f"/api/v1/namespaces/{NAMESPACE}"
        left = raw.request("GET", f"{ns}/pods", labelSelector=f"{LABEL_JOB}=deleted")["items"]
        left += raw.request("GET", f"{ns}/services", labelSelector=f"{LABEL_JOB}=deleted")["items"]
        leases = raw.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases")["items"]
        left += [lease for lease in leases if lease["metadata"]["name"].startswith("deleted-")]
        return not left

    wait_for(children_gone, timeout=120, interval=1.0, message="pods, Service and Leases of the job removed")
    for pod in pods:  # and their processes
        assert e2e_stack.agent.pod_processes(NAMESPACE, pod) == []
