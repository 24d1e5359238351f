"""Evidence before blame (issue 25), end to end: what is not a fault spends no budget and blames no
node, and evidence against a node quarantines that node only. Real operator, real trainer processes
on the local cluster, one test per row: a job that cannot be scheduled waits (condition Waiting, an
Event, nothing restarted); a pod deleted by someone else is a disruption (replaced, counted in
restarts.disruptions, no pod budget spent); a Node condition saying its GPU failed replaces the pod
there and quarantines that node. Each row is also a row of the session's blame matrix
(JobRun.blame; the fault-matrix rows add theirs), printed with its totals at the end.

On kubelet nodes (`make test-e2e-nodes`) more rows run: an image that does not exist (Waiting
naming it, then Failed/ImagePullFailed after containerWaitTimeoutSeconds), a container OOM-killed
by its own memory limit (Failed/ContainerOOMKilled, no node blamed), a pod whose traffic to its
peers is dropped while its Lease renews (found by the reach probe, replaced as PodPartitioned, no
node blamed; each pod there has an IP of its own, routed by this host, so iptables can cut one off),
a kubelet stopped while its containers run (the old incarnation fenced, one live per slot), and a
node two jobs share dying (one taint, one quarantine record with both jobs' evidence, one Event per
job; two jobs' pods can share a node only where each pod has a network namespace of its own).
The node agent runs no images, enforces no limits and gives every pod the host's network (its pods
are processes of the project's virtualenv): there the unit tier (tests/unit/test_ladder_blame.py,
test_ladder_partition.py) covers them, and the integration tier the partition's probes.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from e2e_helpers import (
    FAULT_MID_RUN_STEPS,
    JOBS_PATH,
    NAMESPACE,
    OPERATOR_NAMESPACE,
    JobRun,
    all_training,
    failed,
    lift_quarantine,
    node_record,
    only_on_kubelet_nodes,
    operator_leader,
    succeeded,
)
from rtj.api.status_slots import every_slot
from rtj.contract import QUARANTINE_TAINT_KEY
from rtj.reasons import (
    CONTAINER_OOM_KILLED,
    IMAGE_PULL_FAILED,
    IMAGE_PULL_RETRYING,
    NODE_NOT_READY,
    NODE_QUARANTINE_EXTENDED,
    NODE_QUARANTINED,
    NODE_UNHEALTHY,
    POD_DELETED,
    POD_PARTITIONED,
    REACH_PROBE,
    STALE_POD_FENCED,
    UNSCHEDULABLE,
)
from rtj_local.rawapi import SMP
from rtj_local.timeline import Snapshot
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

START = 240.0  # scheduling, cold `import torch` x ranks, rendezvous: slow on 2 busy cores
FINISH = 300.0
#: How long the unschedulable job is watched after it shows Waiting (the row stays short: a job
#: that waits for nodes is expected to wait, not to act).
WAIT_OBSERVED = 30.0


def disruptions(snap) -> int:
    return int((snap.status.get("restarts") or {}).get("disruptions", 0))


def test_job_asking_for_more_nodes_than_the_cluster_has_waits_unschedulable(run_job, e2e_stack) -> None:
    nodes = len(e2e_stack.nodes) + 1  # one pod per node: one pod can never be scheduled
    created_at = time.time()
    job = run_job("toobig", nodes=nodes, steps=400)

    def waiting(s) -> bool:
        cond = s.condition("Waiting") or {}
        return cond.get("status") == "True" and cond.get("reason") == UNSCHEDULABLE

    snap = job.wait(waiting, 90, "condition Waiting True, reason Unschedulable")
    cond = snap.condition("Waiting") or {}
    assert "unschedulable" in cond.get("message", ""), cond
    assert job.events_about(UNSCHEDULABLE), sorted(job.event_reasons())

    # Then it keeps waiting, nothing restarted and no node blamed.
    end = time.monotonic() + WAIT_OBSERVED
    while time.monotonic() < end:
        job.poll()
        time.sleep(1.0)
    last = job.history[-1]
    assert waiting(last), last.condition("Waiting")
    assert not any(s.is_true("Running") or s.status.get("state") == "Running" for s in job.history), (
        "a job with a slot that cannot be scheduled is never Running"
    )
    assert not any(failed(s) or succeeded(s) for s in job.history), "it waits, it does not end"
    assert last.restarts["podReschedules"] == 0 and last.restarts["job"] == 0, last.restarts
    assert disruptions(last) == 0, last.status.get("restarts")
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    quarantined = [n for n in e2e_stack.nodes if node_record(job.raw, n).taint]
    assert not quarantined, quarantined
    assert not job.event_reasons() & {"NodeQuarantined", "PodRescheduleBudgetExhausted"}, job.event_reasons()
    # One Event when the job started waiting for this reason, not one per pass.
    posted = [ev for ev in job.timeline.events if ev.get("reason") == UNSCHEDULABLE]
    assert len(posted) == 1, job.events_about(UNSCHEDULABLE)
    row = job.blame("unschedulable", created_at, "Waited")
    assert row.right_action and not row.quarantined, row


def test_pod_deleted_by_someone_else_is_a_disruption_and_spends_no_budget(run_job) -> None:
    # No pod budget at all: the deletion (`kubectl delete pod`, a drain) must not need one.
    job = run_job(
        "disrupted", steps=FAULT_MID_RUN_STEPS, interval=5, fault_tolerance={"maxPodReschedules": 0}
    )
    first = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    pods = job.worker_pods(first)
    victim = sorted(pods)[0]
    deleted_at = time.time()
    job.raw.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{victim}")
    job.wait(lambda s: disruptions(s) >= 1 and victim not in s.pods, 120, "the deleted pod replaced")
    last = job.wait(lambda s: succeeded(s) or failed(s), FINISH, "job to finish")
    assert succeeded(last), f"job ended Failed: {last.condition('Failed')}"
    assert disruptions(last) == 1, last.status.get("restarts")
    # Nothing spent for it: no pod reschedule, no job restart since the deletion (a rendezvous pod
    # lost while the job started, say, is another incident).
    assert last.restarts["podReschedules"] == 0, last.restarts
    assert last.restarts["job"] == first.restarts["job"], (first.restarts, last.restarts)
    deleted = job.events_about(POD_DELETED)
    assert any(f"pod {victim} is being deleted" in t and "no budget spent" in t for t in deleted), deleted
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert "NodeQuarantined" not in job.event_reasons(), sorted(job.event_reasons())
    row = job.blame("pod deleted (disruption)", deleted_at, "Replaced")
    assert row.right_action and not row.quarantined, row
    job.assert_checkpoints_never_lost_or_backwards()


#: What the EKS node monitoring agent writes when a GPU fails (docs/fault-classes.md, NodeUnhealthy).
GPU_UNHEALTHY = {
    "type": "AcceleratedHardwareReady",
    "status": "False",
    "reason": "NvidiaXID79Error",
    "message": "GPU has fallen off the bus (Xid 79)",
}


def set_node_condition(raw, node: str, condition: dict[str, str]) -> None:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = {"status": {"conditions": [{**condition, "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    raw.request("PATCH", f"/api/v1/nodes/{node}/status", body, SMP)


def test_gpu_unhealthy_node_condition_replaces_the_pod_and_quarantines_only_that_node(
    run_job, e2e_stack
) -> None:
    job = run_job("gpubad", steps=80, interval=5)
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    # A worker's node, not the rendezvous pod's (whose loss is another row: a job-level recovery).
    rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
    victim = next(s for s in every_slot(snap.status) if s["node"] != rdzv_node)
    marked_at = time.time()
    set_node_condition(job.raw, victim["node"], GPU_UNHEALTHY)
    try:

        def replaced_elsewhere(s) -> bool:
            slot = next(x for x in every_slot(s.status) if x.get("slot") == victim["slot"])
            return slot["pod"] != victim["pod"] and slot.get("node") not in ("", victim["node"])

        job.wait(replaced_elsewhere, 120, "the unhealthy node's pod replaced on another node")
        last = job.wait(lambda s: succeeded(s) or failed(s), FINISH, "job to finish")
        assert succeeded(last), f"job ended Failed: {last.condition('Failed')}"
        record = node_record(job.raw, victim["node"])
        assert record.taint == NODE_UNHEALTHY, record
        assert record.quarantine is not None, record
        assert [e.job for e in record.quarantine.evidence] == [f"{NAMESPACE}/gpubad"], record
        assert "AcceleratedHardwareReady" in record.quarantine.evidence[0].message, record
        about = job.events_about(NODE_UNHEALTHY)
        assert any(GPU_UNHEALTHY["reason"] in t or "AcceleratedHardwareReady" in t for t in about), about
        row = job.blame("GPU-unhealthy node condition", marked_at, "Replaced", quarantined=[victim["node"]])
        assert row.right_action and not row.false_quarantines and not row.missed_quarantines, row
        assert last.restarts["podReschedules"] == 1, last.restarts
        job.assert_checkpoints_never_lost_or_backwards()
    finally:  # the node repaired, as the monitoring agent reports it then
        set_node_condition(job.raw, victim["node"], {**GPU_UNHEALTHY, "status": "True", "reason": "Healthy"})


# --- rows that need a kubelet: images and memory limits (make test-e2e-nodes) -----------------------
#: The node agent runs the pods as processes of the project's virtualenv: no image is pulled and no
#: memory limit enforced, so it never reports ErrImagePull or OOMKilled (tests/unit/test_ladder_blame.py
#: covers those against the pod status a kubelet writes).
@only_on_kubelet_nodes
def test_an_image_that_does_not_exist_waits_then_fails_naming_it(run_job, e2e_stack) -> None:
    image = f"{e2e_stack.trainer_image.rsplit(':', 1)[0]}:no-such-tag"
    created_at = time.time()
    job = run_job("badimage", image=image, fault_tolerance={"containerWaitTimeoutSeconds": 30})

    def waiting_for_the_image(s) -> bool:
        cond = s.condition("Waiting") or {}
        return cond.get("status") == "True" and cond.get("reason") == IMAGE_PULL_RETRYING

    snap = job.wait(waiting_for_the_image, 90, "condition Waiting, reason ImagePullRetrying")
    assert image in (snap.condition("Waiting") or {}).get("message", ""), snap.condition("Waiting")
    last = job.wait(lambda s: failed(s) or succeeded(s), 120, "the job to fail")
    cond = last.condition("Failed") or {}
    assert failed(last) and cond.get("reason") == IMAGE_PULL_FAILED, cond
    assert image in cond.get("message", ""), cond
    assert last.restarts["podReschedules"] == 0 and last.restarts["job"] == 0, last.restarts
    row = job.blame("image does not exist", created_at, "Failed")
    assert row.right_action and not row.quarantined, row


@only_on_kubelet_nodes
def test_a_container_oom_killed_by_its_own_limit_fails_the_job_and_blames_no_node(run_job) -> None:
    # A limit below what a rank needs to import torch: the kernel kills a rank at every start.
    started_at = time.time()
    job = run_job(
        "oom",
        steps=400,
        resources={"memory": "200Mi", "sharedMemorySize": "64Mi"},
        fault_tolerance={"maxInJobRestarts": 1},
    )
    last = job.wait(lambda s: failed(s) or succeeded(s), FINISH, "the job to fail")
    cond = last.condition("Failed") or {}
    assert failed(last) and cond.get("reason") == CONTAINER_OOM_KILLED, cond
    assert "200Mi" in cond.get("message", ""), cond
    assert last.restarts["podReschedules"] == 0, last.restarts
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    row = job.blame("container OOM (own limit)", started_at, "Failed")
    assert row.right_action and not row.quarantined, row


# --- a partition (kubelet nodes: every pod has an IP of its own, routed by this host) ---------------
@contextlib.contextmanager
def traffic_dropped(ip: str, peers: list[str]) -> Iterator[None]:
    """Drop every packet between pod `ip` and the pods `peers`, both ways, in this host's FORWARD
    chain (the kubelet nodes' bridges are routes of this host). The pod's other paths (the API
    server, DNS, the rendezvous pod) stay open: its Lease keeps renewing."""
    rules = [r for peer in peers for r in (["-s", ip, "-d", peer], ["-s", peer, "-d", ip])]
    tag = ["-m", "comment", "--comment", "rtj-e2e-partition"]
    for rule in rules:
        subprocess.run(["iptables", "-I", "FORWARD", *rule, *tag, "-j", "DROP"], check=True)
    try:
        yield
    finally:
        for rule in rules:
            subprocess.run(["iptables", "-D", "FORWARD", *rule, *tag, "-j", "DROP"], check=False)


def pod_ip(raw, name: str) -> str:
    """The pod's IP ("" until it has one)."""
    return ((raw.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}") or {}).get("status") or {}).get(
        "podIP", ""
    )


@only_on_kubelet_nodes
@pytest.mark.timeout(720)
def test_a_pod_cut_off_from_its_peers_is_found_by_their_probes_and_replaced_blaming_no_node(run_job) -> None:
    # Three workers: the cut-off pod is the one neither other reaches, and that reaches neither.
    job = run_job("partition", nodes=3, steps=400, interval=5)
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    slots = {s["slot"]: s for s in every_slot(snap.status)}
    victim = slots[1]
    victim_ip = pod_ip(job.raw, victim["pod"])
    peers = [pod_ip(job.raw, slots[s]["pod"]) for s in (0, 2)]
    cut_at = time.time()

    def slot1(s) -> dict:
        return next(x for x in every_slot(s.status) if x.get("slot") == 1)

    with traffic_dropped(victim_ip, peers):
        job.wait(lambda s: slot1(s)["pod"] != victim["pod"], 180, "the cut-off pod replaced")
        replaced_at = time.time()
    left = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
    assert "rtj-e2e-partition" not in left, left
    new_pod = slot1(job.wait(lambda s: slot1(s)["pod"], 120, "slot 1's new pod"))["pod"]
    new_ip = wait_for(lambda: pod_ip(job.raw, new_pod), timeout=120, interval=1.0, message=f"{new_pod}'s IP")
    print(f"partition: {victim['pod']} {victim_ip} cut off from {peers}; replaced by {new_pod} {new_ip}")
    last = job.wait(all_training, FINISH, "every slot training again")
    slot = slot1(last)
    assert slot["lastFaultReason"] == POD_PARTITIONED, slot
    probes = job.events_about(REACH_PROBE)
    assert probes, sorted(job.event_reasons())
    cut = job.events_about(POD_PARTITIONED)
    assert any(victim["pod"] in t and "slots 0,2 cannot reach it" in t for t in cut), cut
    assert set(job.worker_pods(last)) >= {slots[0]["pod"], slots[2]["pod"]}, "the others kept running"
    assert last.restarts["podReschedules"] == 1, last.restarts
    assert not last.status.get("quarantinedNodes"), last.status.get("quarantinedNodes")
    assert not node_record(job.raw, victim["node"]).faults, "a partition is recorded against no node"
    row = job.blame("partition (one pod cut off)", cut_at, "Replaced")
    assert row.right_action and not row.quarantined, row
    print(
        f"partition: cut -> replaced {replaced_at - cut_at:.1f}s, -> all training {time.time() - cut_at:.1f}s"
    )
    job.steps_lost("partition", "Pod", at=cut_at)


@only_on_kubelet_nodes
@pytest.mark.timeout(600)
def test_a_kubelet_stopped_with_its_containers_running_leaves_one_live_incarnation(
    run_job, e2e_stack
) -> None:
    """Two incarnations of one slot (issue 25, item 5): the node's kubelet stops while its
    containers train on (a kubelet crash; a node cut off from the control plane). The node goes
    NotReady, the pod is replaced on another node; the old pod's heartbeat agent, its Lease gone
    with the deleted pod, recreates it, is fenced, and stops its ranks: one live incarnation, the
    replacement trains with the other pod, the job succeeds."""
    job = run_job("fenced", steps=400, interval=10)  # still training when the node goes NotReady (20 s)
    snap = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 10, START, "a checkpoint")
    rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
    victim = next(s for s in every_slot(snap.status) if s["node"] != rdzv_node)
    nodes = e2e_stack.agent
    stopped_at = time.time()
    nodes.stop_kubelet(victim["node"])
    try:
        assert nodes.pod_processes(NAMESPACE, victim["pod"]), "its containers run on without a kubelet"

        def replaced_elsewhere(s) -> bool:
            slot = next(x for x in every_slot(s.status) if x.get("slot") == victim["slot"])
            return slot["pod"] != victim["pod"] and slot.get("node") not in ("", victim["node"])

        job.wait(replaced_elsewhere, 120, "the pod replaced on another node")
        job.wait(lambda s: bool(job.events_about(STALE_POD_FENCED)), 120, "the old incarnation fenced")
        wait_for(
            lambda: not nodes.pod_processes(NAMESPACE, victim["pod"]),
            timeout=60,
            interval=1.0,
            message=f"the fenced pod {victim['pod']}'s processes to stop (its kubelet still down)",
        )
        stopped = time.time()
        last = job.wait(lambda s: succeeded(s) or failed(s), FINISH, "job to finish")
        assert succeeded(last), f"job ended Failed: {last.condition('Failed')}"
        assert any(victim["pod"] in t for t in job.events_about(STALE_POD_FENCED)), job.events_about(
            STALE_POD_FENCED
        )
        assert last.restarts["podReschedules"] == 1, last.restarts
        row = job.blame("kubelet stopped (fencing)", stopped_at, "Replaced", quarantined=[victim["node"]])
        assert row.right_action and not row.false_quarantines, row
        job.assert_checkpoints_never_lost_or_backwards()
        print(f"fencing: kubelet stopped -> old incarnation's processes gone {stopped - stopped_at:.1f}s")
    finally:  # the kubelet back (it removes what the API server no longer has)
        nodes.up(len(nodes.node_names()))


# --- two jobs on one node (kubelet nodes: every pod has a network namespace of its own) -------------
#: Heartbeat timeout of the shared-node row: longer than the node lifecycle controller takes to see a
#: node's Lease lapse (20 s here), so that the node's death, not its pods' silence, is what each job
#: sees (as test_fault_matrix.NODE_DEATH_HEARTBEAT_TIMEOUT).
SHARED_NODE_HEARTBEAT_TIMEOUT = 60
#: Each pod's CPU in the shared-node row (2 CPUs allocatable per kubelet node, this host's): two workers
#: of different jobs, a rendezvous pod (250m) and an operator pod (100m) fit on one node, and after the
#: node's death both replacements still find room on the three left (with 1 CPU each they did not).
SHARED_NODE_POD_CPU = "500m"


def node_preference(operator: str, nodes: list[str]) -> dict:
    """placement.affinity: prefer (not require) nodes `nodes` (`In`) or every node but them (`NotIn`),
    so that a replacement still finds another node."""
    term = {"matchFields": [{"key": "metadata.name", "operator": operator, "values": nodes}]}
    return {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": term}
    ]}}}  # fmt: skip


def rendezvous_node(snap) -> str:
    return next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), "")


def wait_all(
    jobs: list[tuple[JobRun, Callable[[Snapshot], bool]]], timeout: float, what: str, together: bool = False
) -> dict[str, Snapshot]:
    """Polls every job each second (so that each one's history, and its blame row's seconds, has no
    gaps) until each one's predicate has held, at the same poll if `together`; returns the snapshot of
    each job that satisfied it (the first one unless `together`), by job name."""
    met: dict[str, Snapshot] = {}

    def check() -> dict[str, Snapshot] | None:
        if together:
            met.clear()
        for job, pred in jobs:
            snap = job.poll()
            if job.name not in met and pred(snap):
                met[job.name] = snap
        return dict(met) if len(met) == len(jobs) else None

    return wait_for(
        check,
        timeout=timeout,
        interval=1.0,
        message=lambda: "\n".join([what, *(j.explain() for j, _ in jobs)]),
    )


@only_on_kubelet_nodes
@pytest.mark.timeout(600)
def test_two_jobs_sharing_a_node_that_dies_quarantine_it_once_with_both_jobs_evidence(
    run_job, e2e_stack
) -> None:
    """The quarantine is the node's, not a job's (issue 25), end to end: two jobs each have a worker on
    the node that dies. Each job replaces its own pod there (NodeNotReady) and posts its own Event
    (NodeQuarantined, or NodeQuarantineExtended when it found the other job's taint there); the node
    carries one taint and one record with both jobs' evidence, no other node is tainted, both jobs
    succeed, and deleting the first job leaves the node quarantined. The scheduler is helped to put
    them together (preferred node affinity): the shared node is one of the first job's workers' nodes,
    neither job's rendezvous pod nor the active operator runs there."""
    raw, nodes = e2e_stack.raw, e2e_stack.agent
    leader = wait_for(lambda: operator_leader(raw)[0], timeout=90, interval=1.0, message="an operator leader")
    leader_node = raw.get(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods/{leader}")["spec"]["nodeName"]
    common: dict[str, Any] = {
        "steps": 300,
        "interval": 10,
        "resources": {"cpu": SHARED_NODE_POD_CPU},
        "fault_tolerance": {"heartbeatTimeoutSeconds": SHARED_NODE_HEARTBEAT_TIMEOUT},
    }
    first = run_job("sharea", placement=node_preference("NotIn", [leader_node]), **common)

    def scheduled(s) -> bool:
        return len(s.pods) == 3 and all(p["node"] for p in s.pods.values())

    placed = first.wait(scheduled, 90, "sharea's pods scheduled")
    workers_a = {p["node"] for n, p in placed.pods.items() if not n.endswith("-rdzv")}
    candidates = sorted(workers_a - {rendezvous_node(placed), leader_node})
    assert candidates, f"no worker node of sharea without its rendezvous pod or the operator: {placed.pods}"
    shared = candidates[0]
    second = run_job("shareb", placement=node_preference("In", [shared]), **common)
    placed = second.wait(scheduled, 90, "shareb's pods scheduled")
    assert rendezvous_node(placed) != shared, f"shareb's rendezvous pod is on {shared}: {placed.pods}"
    assert shared in {p["node"] for p in placed.pods.values()}, f"no pod of shareb on {shared}: {placed.pods}"
    jobs = (first, second)

    def training(s) -> bool:
        return all_training(s) and (s.checkpoint_step or 0) >= 10

    snaps = wait_all([(job, training) for job in jobs], START, "both jobs training past a checkpoint", True)
    victims = {}
    for job in jobs:
        snap = snaps[job.name]
        there = [s for s in every_slot(snap.status) if s["node"] == shared]
        assert len(there) == 1, f"{job.name}: one worker on {shared}: {snap.pods}"
        assert rendezvous_node(snap) != shared, f"{job.name}'s rendezvous pod is on {shared}: {snap.pods}"
        assert not (succeeded(snap) or failed(snap)), f"{job.name} ended before the fault"
        victims[job.name] = there[0]
    print(
        f"shared node {shared}: {', '.join(v['pod'] for v in victims.values())} (operator on {leader_node})"
    )
    killed_at = time.time()
    killed = nodes.kill_node(shared)
    try:
        assert {f"{NAMESPACE}/{v['pod']}" for v in victims.values()} <= set(killed), killed

        def replaced_elsewhere(name: str) -> Callable[[Snapshot], bool]:
            victim = victims[name]

            def check(s) -> bool:
                slot = next(x for x in every_slot(s.status) if x.get("slot") == victim["slot"])
                return (
                    slot["pod"] != victim["pod"] and slot.get("node") not in ("", shared) and all_training(s)
                )

            return check

        wait_all(
            [(job, replaced_elsewhere(job.name)) for job in jobs], 240, "each job's pod replaced elsewhere"
        )
        replaced = time.time() - killed_at
        last = wait_all(
            [(job, lambda s: succeeded(s) or failed(s)) for job in jobs], FINISH, "both jobs to finish"
        )
        told = {NODE_QUARANTINED, NODE_QUARANTINE_EXTENDED}
        said: dict[str, list[str]] = {}
        for job in jobs:
            snap = last[job.name]
            assert succeeded(snap), f"{job.name} ended Failed: {snap.condition('Failed')}"
            assert snap.restarts["podReschedules"] == 1, (job.name, snap.restarts)
            assert NODE_NOT_READY in job.event_reasons(), (job.name, sorted(job.event_reasons()))
            assert "HeartbeatTimeout" not in job.event_reasons(), (job.name, sorted(job.event_reasons()))
            assert snap.status.get("quarantinedNodes") == [shared], (
                job.name,
                snap.status.get("quarantinedNodes"),
            )
            said[job.name] = [ev.get("reason", "") for ev in job.timeline.events if ev.get("reason") in told]
            assert len(said[job.name]) == 1, (job.name, job.events_about("NodeQuarantine"))
            assert any(f"node {shared} quarantined" in t for t in job.events_about("NodeQuarantine")), (
                job.name, job.events_about("NodeQuarantine"),
            )  # fmt: skip
        # Both passes may see the node untainted in the same instant: each Event then says
        # NodeQuarantined, and the node still has one taint and one record.
        assert any(NODE_QUARANTINED in r for r in said.values()), said
        node = raw.get(f"/api/v1/nodes/{shared}")
        ours = [t for t in node["spec"].get("taints") or [] if t["key"] == QUARANTINE_TAINT_KEY]
        assert [(t.get("value"), t["effect"]) for t in ours] == [(NODE_NOT_READY, "NoSchedule")], ours
        record = node_record(raw, shared)
        assert record.quarantine is not None and record.quarantine.reason == NODE_NOT_READY, record
        both = {f"{NAMESPACE}/{job.name}" for job in jobs}
        assert sorted(e.job for e in record.quarantine.evidence) == sorted(both), record
        others = [n for n in e2e_stack.nodes if n != shared and node_record(raw, n).taint]
        assert not others, f"only the dead node is quarantined: {others}"
        for job in jobs:
            row = job.blame("node dies, 2 jobs on it", killed_at, "Replaced", quarantined=[shared])
            assert row.right_action and not row.false_quarantines and not row.missed_quarantines, row
            job.assert_checkpoints_never_lost_or_backwards()
        # The quarantine outlives the job that took it (and the other's evidence stays).
        raw.request("DELETE", f"{JOBS_PATH}/{first.name}")
        wait_for(
            lambda: raw.get(f"{JOBS_PATH}/{first.name}") is None,
            timeout=60,
            interval=1.0,
            message="sharea deleted",
        )
        time.sleep(5.0)  # the operator's passes after the deletion
        after = node_record(raw, shared)
        assert after.taint == NODE_NOT_READY, after
        assert after.quarantine is not None and {e.job for e in after.quarantine.evidence} == both, after
        print(f"shared node: killed -> both replaced and training {replaced:.1f}s")
    finally:  # the node back (its kubelet removes what the API server no longer has), then repaired
        nodes.up(len(nodes.node_names()))
        lift_quarantine(raw, shared)
