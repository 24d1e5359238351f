"""Policy: a partitioned pod is found from what its peers can reach, and replaced (issue 25, item 4).

A pod whose traffic to its peers is dropped keeps renewing its Lease (the API server is another
path): no heartbeat goes silent, its ranks only time out in their collectives and restart, in
process and in job, again and again, and the job would sit Recovering until the progress watchdog
failed it. Silence says nothing about which side of a partition is cut off, so the operator asks.

Probe. While some slot has not trained for heartbeatTimeoutSeconds (since its recovery began, or
since the job's step last rose: ranks stuck forming a process group report no restart),
every slot has a running pod, none is being replaced and each pod's heartbeat names its reach
endpoint (contract.Heartbeat.reachEndpoint, the agent's responder), the operator writes a probe
request on each pod's Lease (RequestReachProbe, contract.REACH_PROBE_ANNOTATION): an id (the
request's time) and its peers' endpoints, its ring neighbours up to contract.REACH_MAX_PEERS.
The agent sees it at its next renewal, connects to each, and publishes what it reached at once
(Heartbeat.reach). A job of N pods spends N Lease writes per probe, only while it is stuck, and
the probes back off: T, 2T, 4T, ... into the episode (T = heartbeatTimeoutSeconds), so a slow but
healthy recovery (a replacement pod's cold start) costs a few probes, not one per T.

Verdict, from the answers to the newest probe (all in, or one renew period and the probe timeout
after the request): a slot is accused by each peer that could not reach it, cleared by each that
did. A candidate is cut off both ways: most of its probers could not reach it, and it could not
reach most of its peers (a pod whose own responder died but that reaches everyone is not cut off;
nor is one whose peers disagree: on the 2-core test machine a pod restarting its launcher, busy
importing torch, once left a peer's probe unanswered for the 2 s, and the answers contradicted each
other). The candidate accused by most peers is replaced (PodPartitioned; fewest clearances, then a
slot not already replaced for this partition, then the highest slot break ties). A single broken
link between two pods of a larger job is not a cut-off pod: nothing is replaced for it. With two
pods the evidence is symmetric: one is replaced, and the other if it persists, as one incident.
With three or more pods and no path reached at all, nothing stands out (the probe itself is
blocked, e.g. by a NetworkPolicy): nothing is replaced. Never a quarantine: which end of a broken
path is at fault is unknown. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rtj import contract, reasons
from rtj.api.models import NodeSlotStatus, SlotState
from rtj.ladder import predicates as p
from rtj.ladder import progress_watchdog
from rtj.ladder.actions import RequestReachProbe
from rtj.ladder.observe import LeaseObs, PodObs
from rtj.ladder.pass_state import NORMAL, Pass

#: Slot states of a pod that trains or has finished: such a slot is not stuck.
_SETTLED = frozenset(
    {contract.PodState.TRAINING.value, contract.PodState.FINISHED.value, SlotState.SUCCEEDED}
)


@dataclass(frozen=True)
class Member:
    """A slot's current pod as the probe sees it."""

    slot: NodeSlotStatus
    pod: PodObs
    lease: LeaseObs
    endpoint: str


@dataclass(frozen=True)
class Partitioned:
    """The slot to replace, the evidence, and whether the incident was counted already (the other
    end of a two-pod partition, replaced once before)."""

    slot: NodeSlotStatus
    pod: PodObs
    message: str
    echo: bool


def peers_of(slot: int, slots: list[int]) -> list[int]:
    """The slots `slot` probes: every other one, or its ring neighbours (REACH_MAX_PEERS in all)."""
    others = [s for s in slots if s != slot]
    if len(others) <= contract.REACH_MAX_PEERS:
        return others
    ring = sorted(slots)
    i, n, k = ring.index(slot), len(ring), contract.REACH_MAX_PEERS // 2
    return sorted({ring[(i + d) % n] for d in range(-k, k + 1) if d})


def members(ps: Pass) -> list[Member] | None:
    """Every slot's running pod with a reach endpoint; None when some slot has none (waiting,
    replaced, starting without an agent yet, or a trainer without the responder)."""
    found = []
    for slot in ps.slots:
        pod = next((q for q in ps.workers.get(slot.slot, []) if q.attempt == slot.attempt), None)
        if pod is None or pod.phase != "Running" or pod.deleting or slot.state == SlotState.REPLACING:
            return None
        lease = ps.lease(pod)
        hb = lease.heartbeat if lease is not None else None
        if lease is None or hb is None or not hb.reach_endpoint or lease.fenced:
            return None
        found.append(Member(slot, pod, lease, hb.reach_endpoint))
    return found


def stuck_since(ps: Pass) -> datetime | None:
    """Since when the job has not trained: None while every slot trains (or has finished); else the
    oldest recovery of a slot that does not, or when the job's step last rose, if earlier (ranks
    stuck forming their process group report no restart, only their state)."""
    if all(s.state in _SETTLED for s in ps.slots):
        return None
    times = [s.recovering_since for s in ps.slots if s.recovering_since and s.state not in _SETTLED]
    step = max((step for step, _renew in ps.step_renewals), default=0)
    if step > 0:
        times.append(progress_watchdog.reached_at(step, ps.step_renewals, ps.obs.progress_seen, ps.now))
    return min(times, default=None)


def newest_probe(group: list[Member]) -> contract.ReachProbe | None:
    probes = [m.lease.reach_probe for m in group if m.lease.reach_probe is not None]
    return max(probes, key=lambda q: _probe_time(q) or 0.0, default=None)


def _probe_time(probe: contract.ReachProbe) -> float | None:
    try:
        return float(probe.id)
    except ValueError:
        return None


def request(ps: Pass, group: list[Member], last: contract.ReachProbe | None, since: datetime) -> None:
    """Ask every pod of a job stuck since `since` to probe its peers, backing off (see above)."""
    timeout = ps.ft.heartbeat_timeout_seconds
    begin = p.after(since, timeout)
    last_at = _probe_time(last) if last is not None else None
    if last_at is not None:  # backing off: probes at T, 2T, 4T, ... into the episode
        at = datetime.fromtimestamp(last_at, since.tzinfo)
        begin = max(begin, p.after(at, max(timeout, (at - since).total_seconds())))
    if ps.now < begin:
        ps.due_at(begin)
        return
    probe_id = f"{ps.now.timestamp():.3f}"
    endpoints = {m.slot.slot: m.endpoint for m in group}
    slots = sorted(endpoints)
    for m in group:
        peers = {s: endpoints[s] for s in peers_of(m.slot.slot, slots)}
        ps.d.actions.append(RequestReachProbe(m.lease.name, contract.ReachProbe(id=probe_id, peers=peers)))
    stuck = (ps.now - since).total_seconds()
    ps.event(
        NORMAL,
        reasons.REACH_PROBE,
        f"recovering for {stuck:.0f}s without training: asked the {len(group)} pods to probe their "
        f"peers' reach endpoints (probe {probe_id}) to find a pod the others cannot reach",
    )
    ps.due_at(_answers_due(ps, ps.now))


def _answers_due(ps: Pass, requested: datetime) -> datetime:
    """When every pod has answered a probe requested at `requested` (its next renewal, the probe)."""
    period = ps.st.heartbeat_interval_seconds or ps.ft.heartbeat_interval_seconds
    return p.after(requested, period + contract.REACH_PROBE_TIMEOUT_SECONDS + 1)


def verdict(ps: Pass, group: list[Member], probe: contract.ReachProbe) -> Partitioned | None:
    """The pod to replace from the answers to `probe`; None while answers are missing (before their
    due time) or when nothing stands out."""
    answers = {
        m.slot.slot: r
        for m in group
        if (r := m.lease.heartbeat.reach if m.lease.heartbeat else None) is not None and r.probe == probe.id
    }
    asked_at = _probe_time(probe)
    if len(answers) < len(group):
        if asked_at is None:
            return None
        due = _answers_due(ps, datetime.fromtimestamp(asked_at, ps.now.tzinfo))
        if ps.now < due:
            ps.due_at(due)
            return None
        if len(answers) < 2:
            return None
    if len(group) >= 3 and not any(r.reached for r in answers.values()):
        return None  # no path works at all: the probe is blocked, no pod stands out
    accused = {m.slot.slot: [s for s, r in answers.items() if m.slot.slot in r.unreachable] for m in group}
    cleared = {m.slot.slot: [s for s, r in answers.items() if m.slot.slot in r.reached] for m in group}

    def cut_off(s: int) -> bool:
        """Most of its probers could not reach it, and it could not reach most of its peers."""
        mine = answers.get(s)
        return (
            mine is not None
            and len(accused[s]) > len(cleared[s])
            and len(mine.unreachable) > len(mine.reached)
        )

    candidates = [m for m in group if cut_off(m.slot.slot)]
    if not candidates:
        return None

    def rank(m: Member) -> tuple[int, int, bool, int]:
        s = m.slot.slot
        again = m.slot.last_fault_reason == reasons.POD_PARTITIONED and m.slot.recovering_since is not None
        return (len(accused[s]), -len(cleared[s]), not again, s)

    chosen = max(candidates, key=rank)
    s = chosen.slot.slot
    echo = any(
        m.slot is not chosen.slot
        and m.slot.last_fault_reason == reasons.POD_PARTITIONED
        and m.slot.recovering_since is not None
        for m in group
    )
    mine = answers[s]
    message = (
        f"pod {chosen.pod.name} is cut off from its peers (reach probe {probe.id}): slots "
        f"{_slots(accused[s])} cannot reach it"
        + (f", slots {_slots(cleared[s])} can" if cleared[s] else "")
        + f"; it cannot reach slots {_slots(mine.unreachable)}"
        + (f" and reaches slots {_slots(mine.reached)}" if mine.reached else "")
        + ". No node is blamed: which end of the broken path is at fault is unknown"
    )
    return Partitioned(chosen.slot, chosen.pod, message, echo)


def _slots(values: list[int]) -> str:
    return ",".join(str(v) for v in sorted(values))


def find(ps: Pass) -> Partitioned | None:
    """Request a probe when the job is stuck, or judge the answers to the newest one (see above)."""
    since = stuck_since(ps)  # first: cheap, and None on every pass of a job that trains
    if since is None:
        return None
    group = members(ps)
    if group is None or len(group) < 2:
        return None
    probe = newest_probe(group)
    found = verdict(ps, group, probe) if probe is not None else None
    if found is None:
        request(ps, group, probe, since)
    return found
