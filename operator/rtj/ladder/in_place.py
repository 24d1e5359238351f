"""Policy: level 2b, a pod restarted in place (issue 28). When a worker's in-job budget is spent on a
node with no evidence against it, its trainer exits with contract.ExitCode.RESTART_IN_PLACE and the
pod's restart rule (`restartPolicyRules`, action RestartAllContainers, KEP-5532) makes the kubelet
restart every container of the pod on the same node: same pod, UID, IP and volumes, the memory tier's
/dev/shm included, so the ranks resume from their memory snapshots; no scheduling, no image pull.

Where it is used: the rule only schedules onto nodes whose kubelet declares
contract.RESTART_ALL_CONTAINERS_FEATURE (status.declaredFeatures; Kubernetes 1.35+, on by default
from 1.36), so a job's new pods carry it only when every node its placement selects declares it
(`support`); else they are built as before and a spent in-job budget replaces the pod, and
status.inPlaceRestart says why. The trainer enforces the per-pod budget
(faultTolerance.maxInPlaceRestarts, counted in the pod's memory volume): once spent it exits as
before (70) and the pod is replaced. A pod whose in-place restart never comes back is replaced
once startupTimeoutSeconds have passed since its last heartbeat, which said it restarts in place
(rtj.ladder.predicates.heartbeat_silence); ranks killed by the container's own memory limit are
never restarted in place (the trainer reports ContainerOOMKilled and the job fails).

Counting (`observe`): the trainer container's restartCount rising with its last exit code 76 (or
the kubelet's RestartingAllContainers reason) is one in-place restart of the slot's pod, one
incident (RestartedInPlace) whatever the in-job restarts it causes on the peers
(rtj.ladder.slots._new_incident takes those for its echoes while the slot recovers at this level)."""

from __future__ import annotations

from collections.abc import Iterable

from rtj import contract, reasons
from rtj.api.models import InPlaceRestartStatus, NodeSlotStatus, ResilientTrainingJob
from rtj.ladder import blame, incidents
from rtj.ladder.actions import RestartObserved
from rtj.ladder.observe import NodeObs, PodObs
from rtj.ladder.pass_state import NORMAL, Pass

#: Nodes named in a message saying which lack the feature.
NAMED_NODES = 3


def selects(job: ResilientTrainingJob, node: NodeObs) -> bool:
    """The job's placement (instance type and nodeSelector) selects `node`, and it takes pods."""
    labels = dict(node.labels)
    wanted = job.spec.placement.node_labels()
    return not node.unschedulable and all(labels.get(k) == v for k, v in wanted.items())


def support(job: ResilientTrainingJob, nodes: Iterable[NodeObs]) -> InPlaceRestartStatus:
    """Whether the job's new pods can carry the restart rule, and why (status.inPlaceRestart)."""
    if job.spec.fault_tolerance.max_in_place_restarts == 0:
        return InPlaceRestartStatus(available=False, message="off: faultTolerance.maxInPlaceRestarts is 0")
    eligible = [n for n in nodes if selects(job, n)]
    if not eligible:
        return InPlaceRestartStatus(
            available=False, message="no schedulable node matches the job's placement yet"
        )
    feature = contract.RESTART_ALL_CONTAINERS_FEATURE
    lacking = sorted(n.name for n in eligible if feature not in n.declared_features)
    if lacking:
        named = ", ".join(lacking[:NAMED_NODES]) + (", ..." if len(lacking) > NAMED_NODES else "")
        return InPlaceRestartStatus(
            available=False,
            message=f"{len(lacking)} of {len(eligible)} nodes for the job do not declare "
            f"{contract.RESTART_ALL_CONTAINERS_FEATURE} ({named}): a pod whose in-job budget is spent "
            "is replaced",
        )
    return InPlaceRestartStatus(
        available=True,
        message=f"all {len(eligible)} nodes for the job declare {contract.RESTART_ALL_CONTAINERS_FEATURE}",
    )


def pod_budget(job: ResilientTrainingJob, status: InPlaceRestartStatus | None) -> int:
    """In-place restarts a new pod may take: 0 (no restart rule) unless available."""
    return job.spec.fault_tolerance.max_in_place_restarts if status is not None and status.available else 0


def observe(ps: Pass, slot: NodeSlotStatus, pod: PodObs) -> None:
    """Count the slot's pod's in-place restarts since the last pass (its trainer container's
    restartCount, its last run ended with RESTART_IN_PLACE or, as the kubelet reports a restart of
    all containers, RESTARTING_ALL_CONTAINERS_REASON): one incident each. A last run the
    container's own memory limit OOM-killed fails the job instead, as it does a Failed pod. Pods
    restarting in place while another slot's in-place recovery is under way are that incident's."""
    trainer = pod.trainer
    if trainer is None:
        return
    delta = trainer.restart_count - slot.in_place_restarts
    slot.in_place_restarts = trainer.restart_count  # never backwards: a lower count resets it
    in_place = (
        trainer.exit_code == contract.ExitCode.RESTART_IN_PLACE
        or trainer.terminated_reason == contract.RESTARTING_ALL_CONTAINERS_REASON
    )
    if delta <= 0 or not in_place:
        return
    oom = blame.oom_killed(pod, ps.spec.resources.memory or "")
    if oom is not None:  # ranks killed by the container's own limit: it would only happen again
        ps.note_fault(slot, oom.reason, pod.name, pod.node)
        ps.failed = (oom.reason, f"slot {slot.slot}: {oom.message}")
        return
    together = [s.slot for s in ps.slots if s is not slot and s.recovering_level == reasons.LEVEL_IN_PLACE]
    slot.recovering_since = slot.recovering_since or ps.now
    slot.recovering_level = reasons.LEVEL_IN_PLACE
    if together:
        # One fault can spend every launcher's budget at once (each launcher restarts its workers
        # on every fault): this pod's in-place restart is one more pod of that incident.
        incidents.echo(ps, ps.now)
        ps.event(
            NORMAL,
            reasons.IN_PLACE_RESTART,
            f"slot {slot.slot}: pod {pod.name} restarted in place with slot(s) "
            f"{', '.join(map(str, together))} (one incident); no pod replaced",
        )
        return
    ps.st.restarts.in_place += delta
    ps.d.restarts.append(RestartObserved(reasons.LEVEL_IN_PLACE, reasons.IN_PLACE_RESTART, delta))
    evidence = (
        f"pod {pod.name} restarted in place on node {pod.node or '?'} (its trainer exited with "
        f"{contract.ExitCode.RESTART_IN_PLACE}: in-job budget spent; restart {trainer.restart_count} "
        f"of {ps.ft.max_in_place_restarts}); memory snapshots kept"
    )
    ps.note_fault(slot, reasons.IN_PLACE_RESTART, pod.name, pod.node)
    incidents.record(
        ps,
        reasons.IN_PLACE_RESTART,
        incidents.RESTARTED_IN_PLACE,
        evidence,
        level=reasons.LEVEL_IN_PLACE,
        slot=slot,
        pod=pod.name,
        node=pod.node,
    )
    ps.event(NORMAL, reasons.IN_PLACE_RESTART, f"slot {slot.slot}: {evidence}; no pod replaced")
