"""Policy: hot spares: kept started ahead of need, promoted into a faulted slot when on Standby."""

from __future__ import annotations

from rtj.api.models import (
    SlotState,
    SpareStatus,
)
from rtj.contract import PodState
from rtj.ladder import in_place
from rtj.ladder import predicates as p
from rtj.ladder.actions import (
    CreateSparePod,
)
from rtj.ladder.observe import PodObs
from rtj.ladder.pass_state import Pass


def standby(ps: Pass, slot: int) -> PodObs | None:
    """A ready spare for `slot`: one already signalled for this slot first (its relabel was
    lost), then any unsignalled one; a spare signalled for another slot is never reused."""
    candidates: list[PodObs] = []
    for index in sorted(ps.spares):
        for pod in sorted(ps.spares[index], key=lambda q: q.attempt, reverse=True):
            lease = ps.lease(pod)
            if (
                lease is not None
                and lease.assigned_slot == str(slot)
                and pod.phase == "Running"
                and not pod.deleting
                and pod.name not in ps.promoted_spares
            ):
                return pod  # signalled already (it may have left Standby): finish its promotion
            if (
                pod.name not in ps.promoted_spares
                and p.is_standby_spare(pod, lease, ps.ft, ps.now)
                and lease is not None
                and lease.assigned_slot is None
                and pod.node not in ps.st.quarantined_nodes
            ):
                candidates.append(pod)
    return candidates[0] if candidates else None


def keep(ps: Pass) -> None:
    by_index = {s.index: s for s in ps.st.spares}
    out: list[SpareStatus] = []
    for index in range(ps.spec.hot_spares):
        entry = by_index.get(index) or SpareStatus(index=index)
        pods = [q for q in ps.spares.get(index, []) if q.name not in ps.promoted_spares]
        entry.attempt = max([entry.attempt, *(q.attempt for q in pods)])
        current = next((q for q in pods if q.attempt == entry.attempt), None)
        signalled = ps.lease(current) if current is not None else None
        lost = current is not None and (
            ps.node_verdict(current.node) is not None
            # Signalled to join a slot but not promoted into one (a lost relabel whose slot was
            # filled otherwise): it must not stay, or two pods would serve that slot.
            or (signalled is not None and signalled.assigned_slot is not None)
        )
        if current is not None and (current.terminal or lost):
            ps.delete(current, 0)
        if current is None or current.terminal or current.deleting or lost:
            if entry.pod or current is not None:  # that attempt was used: promoted, failed, deleted
                entry.attempt += 1
            entry.pod, entry.node, entry.state = "", "", SlotState.PENDING
            if not any(q.live and not q.deleting and q is not current for q in pods):
                budget = in_place.pod_budget(ps.job, ps.st.in_place_restart)
                ps.d.actions.append(CreateSparePod(index, entry.attempt, ps.avoid_nodes(), budget))
        else:
            entry.pod, entry.node = current.name, current.node
            entry.state = (
                PodState.STANDBY
                if p.is_standby_spare(current, ps.lease(current), ps.ft, ps.now)
                else (SlotState.STARTING if current.phase == "Running" else SlotState.PENDING)
            )
        out.append(entry)
    for index, pods in ps.spares.items():
        if index >= ps.spec.hot_spares:
            for pod in pods:
                if pod.live:
                    ps.delete(pod, None)
    ps.st.spares = out
