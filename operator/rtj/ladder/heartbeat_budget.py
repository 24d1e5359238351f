"""policy: the heartbeat budget: the Lease renew period a job's new pods get (issue 30).

Every worker pod renews its heartbeat Lease once per period P, and each renewal is a write the API
server validates, stores in etcd and sends to the operator's watch; a hot spare in standby renews
every contract.STANDBY_RENEW_SECONDS whatever P is (that is how fast it sees its promotion). The
operator holds all its jobs to one budget B of such writes per second (the setting
RTJ_HEARTBEAT_WRITES_PER_SECOND; 0: none) and to each job's deadline T (heartbeatTimeoutSeconds):

    room   = B - standby spares / STANDBY_RENEW_SECONDS     what the spares leave to the workers
    needed = ceil(worker pods / room)                        one period for every worker of every job
    bound  = floor(T / MISSES_BEFORE_DEADLINE)               3 renewals may be missed before T
    P      = the spec's interval, if needed is not longer;
           = needed, if it is within the bound;
           = max(the spec's interval, bound) otherwise, and the job shows condition
             HeartbeatBudgetExceeded naming the budget, the pods and the period (never silently).

So the budget only ever lengthens the spec's interval, never past a third of the spec's timeout: a
silent pod is still replaced at T, and a healthy slot is never older than T / 2 between renewals
(the outage hold's and the wake-up's "stale"). Worker pods and spares are those of the jobs the
operator runs: not suspended, not queued by Kueue, not finished (`fleet`), this job included.

The period reaches a new pod at its creation (TrainerConfig.heartbeatIntervalSeconds, read by the
trainer's heartbeat agent) and a running one on its Lease: when the job's period P differs from the
one a pod renews at (its Lease's RENEW_PERIOD_ANNOTATION, else its leaseDurationSeconds / 3, as the
agent writes it), the operator writes P there once (SetRenewPeriod) and the agent renews every P
from its next renewal. So pods created while the cluster was emptier follow a budget that later
jobs tightened, and go back to the spec's interval when those end. status.heartbeatIntervalSeconds
shows P. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rtj import contract, reasons
from rtj.api.models import FaultTolerance, JobState
from rtj.ladder.actions import SetRenewPeriod
from rtj.ladder.conditions import get_condition
from rtj.ladder.observe import Fleet, LeaseObs
from rtj.ladder.pass_state import NORMAL, WARNING, Pass

#: Renewals that may be missed before heartbeatTimeoutSeconds (the kubelet's node Lease: 10 s
#: renewals, 40 s duration, k = 4): a slow or failed write costs no false fault.
MISSES_BEFORE_DEADLINE = 3
#: Jobs whose pods do not run (status.state): they take no share of the budget.
_IDLE_STATES = frozenset({JobState.SUSPENDED, JobState.QUEUED, JobState.SUCCEEDED, JobState.FAILED})


@dataclass(frozen=True)
class RenewPeriod:
    """The period a job's new pods get, and why."""

    #: Seconds between a new pod's renewals (TrainerConfig.heartbeatIntervalSeconds).
    seconds: int
    #: The period the budget asks for (0: no budget, or room for any period; None: the standby
    #: spares alone take the whole budget, no period is long enough).
    needed: int | None
    #: The longest period the job's heartbeatTimeoutSeconds allows.
    bound: int
    #: The budget cannot be met within the bound (condition HeartbeatBudgetExceeded).
    exceeded: bool


def renew_period(ft: FaultTolerance, fleet: Fleet, writes_per_second: float) -> RenewPeriod:
    """The renew period of a job's new pods, from its spec, all jobs' pods and the budget."""
    interval = ft.heartbeat_interval_seconds
    bound = max(1, ft.heartbeat_timeout_seconds // MISSES_BEFORE_DEADLINE)
    if writes_per_second <= 0 or fleet.workers + fleet.spares == 0:
        return RenewPeriod(interval, 0, bound, False)
    room = writes_per_second - fleet.spare_writes_per_second
    needed = math.ceil(fleet.workers / room) if room > 0 else None
    if needed is not None and needed <= interval:
        return RenewPeriod(interval, needed, bound, False)
    if needed is not None and needed <= bound:
        return RenewPeriod(needed, needed, bound, False)
    return RenewPeriod(max(interval, bound), needed, bound, True)


def pods_of(body: Mapping[str, Any]) -> Fleet:
    """The heartbeating pods a job (its API object, plain) runs: none while suspended, queued or
    finished; else its nodes' workers and its hot spares."""
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    if spec.get("suspend") or status.get("state") in _IDLE_STATES:
        return Fleet()
    return Fleet(_count(spec.get("nodes")), _count(spec.get("hotSpares")))


def fleet(bodies: Iterable[Mapping[str, Any]]) -> Fleet:
    """All heartbeating pods of these jobs (the operator's other jobs; `apply` adds the job's own)."""
    total = Fleet()
    for body in bodies:
        total += pods_of(body)
    return total


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def apply(ps: Pass) -> None:
    """status.heartbeatIntervalSeconds for the pods this pass creates; condition
    HeartbeatBudgetExceeded (and a Warning Event once per episode) while the bound binds."""
    own = Fleet(ps.spec.nodes, ps.spec.hot_spares)
    every = own + (ps.obs.fleet or Fleet())
    budget = ps.cfg.heartbeat_writes_per_second
    period = renew_period(ps.ft, every, budget)
    ps.st.heartbeat_interval_seconds = period.seconds
    follow(ps, period.seconds)
    kind = reasons.HEARTBEAT_BUDGET_EXCEEDED
    old = get_condition(ps.old.conditions, kind)
    if period.exceeded:
        message = exceeded_message(ps.ft, every, own, budget, period)
        if old is None or old.status != "True":
            ps.event(WARNING, kind, message)
        ps.cond(kind, True, kind, message)
    elif old is not None and old.status == "True":
        message = (
            f"the heartbeat budget of {budget:g} Lease writes/s is met: this job's new pods renew "
            f"every {period.seconds}s"
        )
        ps.event(NORMAL, reasons.HEARTBEAT_BUDGET_MET, message)
        ps.cond(kind, False, reasons.HEARTBEAT_BUDGET_MET, message)


def lease_period(lease: LeaseObs) -> float | None:
    """The period a Lease's pod renews at: the one the operator asked for, else the one its
    leaseDurationSeconds says (3 periods); None when neither is known."""
    if lease.renew_period is not None:
        return float(lease.renew_period)
    return lease.duration_seconds / 3 if lease.duration_seconds else None


def follow(ps: Pass, seconds: int) -> None:
    """Ask each heartbeating pod of the job whose period is not `seconds` to renew every `seconds`."""
    wanted = contract.lease_duration_seconds(seconds)
    for lease in ps.obs.leases.values():
        current = lease_period(lease)
        if lease.fenced or lease.renew_time is None or current is None:
            continue
        if contract.lease_duration_seconds(current) != wanted:
            ps.d.actions.append(SetRenewPeriod(lease.name, seconds))


def exceeded_message(ft: FaultTolerance, every: Fleet, own: Fleet, budget: float, period: RenewPeriod) -> str:
    """What the condition and its Event say: the budget, the pods, the period needed and used."""
    pods = f"{every.workers} worker pods"
    if every.spares:
        each = f"{contract.STANDBY_RENEW_SECONDS:g}s"
        pods += f" and {every.spares} standby spares (each renewing every {each})"
    need = (
        f"need a renew period of {period.needed}s"
        if period.needed is not None
        else "cannot fit: the spares alone take the whole budget"
    )
    writes = every.workers / period.seconds + every.spare_writes_per_second
    return (
        f"heartbeat budget of {budget:g} Lease writes/s (RTJ_HEARTBEAT_WRITES_PER_SECOND) exceeded: "
        f"{pods} of this operator's jobs {need}, but heartbeatTimeoutSeconds={ft.heartbeat_timeout_seconds} "
        f"allows at most {period.bound}s ({MISSES_BEFORE_DEADLINE} renewals per timeout); this job's "
        f"{own.workers + own.spares} pods renew every {period.seconds}s (up to ~{writes:.0f} writes/s in "
        f"all at that period). Raise heartbeatTimeoutSeconds or the budget, or run fewer pods"
    )
