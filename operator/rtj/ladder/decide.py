"""The escalation ladder as one pure function: `decide(job, observed, now) -> Decision`.

Levels (each with a budget, a condition reason, an Event and a metric):
1. In-process restart (NVRx inprocess.Wrapper) and 2. in-job restart (ft_launcher): soft faults,
   seen only as heartbeat counters going up; counted, pods untouched.
3. Hard fault (heartbeat silent past its deadline, pod Failed with a restartable exit code, pod
   evicted/deleted, node NotReady/lost, a pod-reported hard fault): replace that ONE pod (attempt+1);
   the others keep running and re-rendezvous. The old pod is deleted first and its replacement is
   created only once it is gone, so a slot never has two live pods. A standby hot spare is promoted
   instead of creating a pod when one is ready.
4. maxPodReschedules exceeded or a do-not-restart exit code: the job Fails; nothing is restarted and
   every pod that still runs is deleted (GPUs freed; pods that already ended are kept for `kubectl
   logs`). All workers Succeeded: the job Succeeded (the rendezvous pod and spares are deleted).

Exactly-once counting: every counter is committed by the status write of the pass that observed
it. Soft restarts are deltas against the per-slot "last seen" counts stored in the same status;
pod reschedules are derived from attempts (a pod whose attempt is newer than the status knows and
whose cause annotation names a fault counts once), so a crash between creating a pod and writing
status neither loses nor doubles a count. The handler writes status with a resourceVersion
precondition, so a pass computed from a stale copy cannot commit.
"""

from __future__ import annotations

from datetime import datetime

from rtj import contract, reasons
from rtj.api.models import ConditionType, JobState, NodeSlotStatus, ResilientTrainingJob, SlotState
from rtj.ladder import (
    create_refusals,
    endings,
    event_outbox,
    fencing,
    heartbeat_budget,
    in_place,
    job_level,
    kueue_admission,
    node_writes,
    outage_hold,
    partition,
    predicates,
    progress_watchdog,
    rendezvous,
    slots,
    spares,
    summary,
    training_finished,
)
from rtj.ladder.conditions import get_condition, is_true
from rtj.ladder.observe import Observed, PodObs
from rtj.ladder.pass_state import NORMAL, WARNING, Decision, LadderConfig, Pass


def run(ps: Pass) -> Decision:
    ps.st.observed_generation = ps.generation
    ps.st.nodes_desired = ps.spec.nodes
    node_writes.carry(ps)  # what a crashed pass decided for a node and did not do
    if is_true(ps.old.conditions, ConditionType.SUCCEEDED) or is_true(
        ps.old.conditions, ConditionType.FAILED
    ):
        endings.finished(ps)
    elif ps.spec.suspend:
        suspended(ps)
    elif (held := kueue_admission.hold(ps.job, ps.obs.workload, ps.cfg.kueue_enabled)) is not None:
        suspended(ps, held.reason, held.message, JobState.QUEUED)
    else:
        active(ps)
        slots.apply_heartbeat_times(ps)
    ps.d.actions += kueue_admission.workload_actions(
        ps.job, ps.obs.workload, ps.st, ps.obs.pods, ps.cfg.kueue_enabled, ps.now, ps.slots
    )
    if ps.st.state not in (JobState.FAILED, JobState.SUCCEEDED, JobState.SUSPENDED):
        create_refusal(ps)  # a queued job's Workload create too (Kueue's CRDs missing: 404)
    if ps.st.state in (JobState.FAILED, JobState.SUCCEEDED, JobState.SUSPENDED, JobState.QUEUED):
        ps.st.steps_per_second = None  # no pod trains: a last rate would read as training
    ps.st.set_slots(ps.slots)
    event_outbox.record(ps.st, ps.d.events, ps.obs.events_posted, ps.now)
    ps.d.status = ps.st
    return ps.d


def suspended(
    ps: Pass,
    reason: str = reasons.SUSPENDED,
    message: str = "spec.suspend is true",
    state: str = JobState.SUSPENDED,
) -> None:
    """No pods: spec.suspend, or (rtj.ladder.kueue_admission) a queued job Kueue has not admitted."""
    ps.delete_live_pods({contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
    for slot in ps.slots:
        slot.pod, slot.node, slot.state = "", "", SlotState.SUSPENDED
        slot.recovering_since, slot.recovering_level = None, ""
    ps.st.spares = []
    ps.st.rendezvous_pod_uid = ""  # the one recreated on resume is not a recovery
    summary.close_degraded(ps)
    if summary.condition_reason(ps.old.conditions, ConditionType.SUSPENDED) != reason:
        kept = "job suspended: pods removed; status and checkpoints kept"
        ps.event(NORMAL, reason, kept if reason == reasons.SUSPENDED else message)
    ps.cond(ConditionType.SUSPENDED, True, reason, message)
    ps.cond(ConditionType.RUNNING, False, reason, "")
    ps.cond(ConditionType.RECOVERING, False, reason, "")
    ps.cond(ConditionType.DEGRADED, False, reason, "")
    ps.st.nodes_ready = 0
    ps.st.state, ps.st.reason = JobState(state), reason


#: A slot's fault as slots.observe found it: the slot, its pod (if any), the reason and the message.
Fault = tuple[NodeSlotStatus, PodObs | None, str, str]


def active(ps: Pass) -> None:
    if ps.obs.refused:
        endings.fail(ps, reasons.INVALID_SPEC, ps.obs.refused)
        return
    causes = resume(ps) if is_true(ps.old.conditions, ConditionType.SUSPENDED) else {}
    heartbeat_budget.apply(ps)  # the renew period of the pods this pass creates
    if ps.obs.nodes_known:  # whether the pods this pass creates carry the in-place restart rule
        ps.st.in_place_restart = in_place.support(ps.job, ps.obs.all_nodes)
    rendezvous.reconcile(ps)
    faults = observe_slots(ps)
    if ps.failed is None and training_finished.applies(ps):
        finishing(ps, faults)
        return
    replace_faulted(ps, faults)
    if not faults and ps.failed is None and (cut := partition.find(ps)) is not None:
        slots.hard_fault(ps, cut.slot, cut.pod, reasons.POD_PARTITIONED, cut.message, counted=not cut.echo)
    if ps.failed is not None:
        endings.fail(ps, *ps.failed)
        return
    for slot in ps.slots:
        slots.fill(ps, slot, causes.get(slot.slot))
    fencing.fence(ps)
    spares.keep(ps)
    summary.summarize(ps)
    watch_progress(ps)


def resume(ps: Pass) -> dict[int, str]:
    """A suspended job resumes: every slot's next pod is a new attempt; the cause of each, by slot."""
    causes: dict[int, str] = {}
    for slot in ps.slots:
        slot.attempt += 1
        slot.pod, slot.state, slot.last_heartbeat_time = "", SlotState.PENDING, None
        slot.lease_missing_since = None
        slot.in_process_restarts = slot.in_job_restarts = slot.in_place_restarts = 0
        causes[slot.slot] = reasons.CAUSE_RESUME
    ps.cond(ConditionType.SUSPENDED, False, reasons.RESUMED, "")
    ran = ps.st.start_time is not None
    ps.event(
        NORMAL,
        reasons.RESUMED,
        "job resumed: pods recreated (attempt numbers continue)"
        if ran
        else "job started: it was created suspended or queued; its first pods created",
    )
    return causes


def observe_slots(ps: Pass) -> list[Fault]:
    """Each slot's observation (rtj.ladder.slots), less the silence an outage hold keeps."""
    faults: list[Fault] = []
    for slot in ps.slots:
        fault = slots.observe(ps, slot)
        if fault is not None:
            faults.append((slot, *fault))
    slots.count_collateral(ps)
    return hold_correlated_silence(ps, faults)


def finishing(ps: Pass, faults: list[Fault]) -> None:
    """rtj.ladder.training_finished: the job ends once its slots settle; until then no pod is created
    and no spare kept."""
    if training_finished.settle(ps, faults):
        reason, message = training_finished.outcome(ps)
        if reason == reasons.TRAINING_INCOMPLETE:
            endings.fail(ps, reason, message)
        else:
            endings.succeed(ps, reason, message)
        return
    summary.summarize(ps)
    watch_progress(ps, training_finished.running_slots(ps))


def replace_faulted(ps: Pass, faults: list[Fault]) -> None:
    """Each fault replaces its slot's pod (rtj.ladder.slots), or all of them when the job itself is
    at fault (rtj.ladder.job_level); stops at the first fault that fails the job (ps.failed)."""
    # Many slots failing in one pass is a correlated fault (network, a zone), not several bad
    # nodes: replace the pods, quarantine no node.
    ps.correlated = len(faults) > 1 and len(faults) * 2 > ps.spec.nodes
    job_reason = job_level.attribute([f[2] for f in faults], ps.st, ps.ft, ps.now)
    if job_reason == reasons.PODS_FAILED_TOGETHER:
        job_level.begin(ps.st, ps.ft, ps.now)
    if ps.failed is not None:
        return
    for slot, pod, reason, message in faults:
        if job_reason is not None and reason in job_level.SYMPTOMS:
            slots.job_fault(ps, slot, pod, message, job_reason, reason in slots.FORCE)
        else:
            slots.hard_fault(ps, slot, pod, reason, message)
        if ps.failed is not None:
            break


def watch_progress(ps: Pass, judged: list[NodeSlotStatus] | None = None) -> None:
    """rtj.ladder.progress_watchdog: Stalled, then NoProgress (of the `judged` slots, default all)."""
    verdict = progress_watchdog.check(
        ps.st,
        ps.slots if judged is None else judged,
        ps.step_renewals,
        ps.obs.progress_seen,
        ps.ft,
        ps.now,
        ps.cfg.heartbeat_status_resolution_seconds,
    )
    if verdict.failed:
        endings.fail(ps, reasons.NO_PROGRESS, verdict.message)
        return
    ps.due_at(verdict.due)
    if verdict.stalled:
        if not is_true(ps.old.conditions, ConditionType.STALLED):
            ps.event(
                WARNING,
                reasons.STALLED,
                f"{verdict.message}; the job fails NoProgress if this lasts as long again",
            )
        ps.cond(ConditionType.STALLED, True, reasons.STALLED, verdict.message)
        ps.st.reason = reasons.STALLED
    elif get_condition(ps.old.conditions, ConditionType.STALLED) is not None:
        ps.cond(ConditionType.STALLED, False, reasons.PROGRESSING, "")


def hold_correlated_silence(ps: Pass, faults: list[Fault]) -> list[Fault]:
    """rtj.ladder.outage_hold: silence of most slots at once is held, with hysteresis."""
    silent = [f for f in faults if f[2] in (reasons.HEARTBEAT_TIMEOUT, reasons.STARTUP_TIMEOUT)]
    stale = outage_hold.stale_count(len(silent), ps.d.heartbeat_ages, ps.ft)
    was_held = summary.condition_reason(ps.old.conditions, ConditionType.DEGRADED) == reasons.HEARTBEATS_STALE
    held = outage_hold.holds(was_held, len(silent), stale, ps.spec.nodes)
    if not held and not was_held:
        return faults
    for slot, _pod, _reason, _message in silent:
        slot.state = SlotState.SILENT
    if held:
        ps.stale_heartbeats = outage_hold.message(stale, ps.spec.nodes)
    else:  # the hold ends: a slot still silent gets a whole deadline from now
        ps.st.heartbeat_hold_end_time = ps.now
        ps.due_at(predicates.after(ps.now, ps.ft.heartbeat_timeout_seconds))
    return [f for f in faults if f not in silent]


def create_refusal(ps: Pass) -> None:
    refusal = ps.obs.create_refusal
    old = get_condition(ps.old.conditions, ConditionType.CREATE_REFUSED)
    if refusal is None:
        if old is not None and old.status == "True":
            ps.cond(ConditionType.CREATE_REFUSED, False, reasons.CREATES_ACCEPTED, "")
        return
    held = create_refusals.held_back(ps.d.actions, refusal, ps.now)
    if held != ps.d.actions:
        ps.due_at(create_refusals.retry_at(refusal))
    ps.d.actions = held
    message = f"the API server refused to create the job's objects ({refusal.status}): {refusal.message}"
    if old is None or old.status != "True" or old.message != message[:1024]:
        ps.event(
            WARNING,
            reasons.CREATE_REFUSED,
            f"{message}; retried with backoff until it is accepted",
        )
    ps.cond(ConditionType.CREATE_REFUSED, True, refusal.reason or reasons.CREATE_REFUSED, message)
    if ps.st.state in (JobState.PENDING, JobState.QUEUED):
        ps.st.reason = reasons.CREATE_REFUSED


def decide(
    job: ResilientTrainingJob, observed: Observed, now: datetime, config: LadderConfig | None = None
) -> Decision:
    """The next actions, the new status and the events for one job. Pure: no I/O, clock passed in.
    The policies live in their own modules (rendezvous, slots, spares, endings, summary, and those
    named below); this function only orders them."""
    return run(Pass(job, observed, now, config or LadderConfig()))
