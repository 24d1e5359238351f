"""Evidence before blame (issue 25), end to end: what is not a fault spends no budget and blames no
node. Real operator, real trainer processes on the local cluster, one test per row: a job that
cannot be scheduled waits (condition Waiting, an Event, nothing restarted), and a pod deleted by
someone else is a disruption (replaced, counted in restarts.disruptions, no pod budget spent).

No bad-image row: the node agent runs no images (its pods are processes of the project's
virtualenv), so it never reports ErrImagePull/ImagePullBackOff; those are covered by the unit tier
(tests/unit/test_ladder_blame.py) against the pod status a kubelet writes.
"""

from __future__ import annotations

import time

import pytest
from e2e_helpers import NAMESPACE, all_training, failed, node_record, succeeded
from rtj.reasons import POD_DELETED, UNSCHEDULABLE

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


def test_pod_deleted_by_someone_else_is_a_disruption_and_spends_no_budget(run_job) -> None:
    # No pod budget at all: the deletion (`kubectl delete pod`, a drain) must not need one.
    job = run_job("disrupted", steps=60, interval=5, fault_tolerance={"maxPodReschedules": 0})
    first = job.wait(lambda s: all_training(s) and (s.checkpoint_step or 0) >= 5, START, "a checkpoint")
    pods = job.worker_pods(first)
    victim = sorted(pods)[0]
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
    job.assert_checkpoints_never_lost_or_backwards()
