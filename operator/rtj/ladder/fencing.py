"""Policy: one live incarnation per slot. A pod replaced while it may still run (its node's kubelet
stopped with the containers running, a node cut off from the control plane) is fenced: the
operator marks the Lease of every stale attempt that still heartbeats with FENCED_ANNOTATION, and
that pod's heartbeat agent stops its ranks at its next renewal, without saving (rtj_trainer), so
the replacement trains with the others instead of waiting for it.

A Lease is fenced when its name is a worker pod name of this job whose attempt is older than its
slot's current one, it was renewed within heartbeatTimeoutSeconds, and its agent recreated it
after it vanished (owned by the job: rtj_trainer does so when its pod-owned Lease is gone, which is
what garbage collection does once the replaced pod object is deleted). The old pod of an ordinary
replacement, stopped by its kubelet, never recreates its Lease and is never fenced. Once fenced,
a stale Lease whose pod is gone and that has stopped renewing is deleted (owned by the job,
garbage collection would keep it for the job's life).

A node cut off from the API server cannot read its fence; its pods are replaced on the heartbeat
deadline as before, and their ranks fail at the first collective with the new incarnation.
"""

from __future__ import annotations

from rtj import contract, reasons
from rtj.ladder import predicates as p
from rtj.ladder.actions import DeleteLease, FenceLease
from rtj.ladder.pass_state import WARNING, Pass


def fence(ps: Pass) -> None:
    for lease in ps.obs.leases.values():
        parsed = contract.parse_worker_pod_name(lease.name)
        if parsed is None or not 0 <= parsed[0] < len(ps.slots):
            continue
        slot, attempt = parsed
        current = ps.slots[slot].attempt
        if attempt >= current:
            continue
        renewing = p.heartbeat_fresh(lease, ps.ft, ps.now)
        if lease.fenced:
            if not renewing and lease.name not in ps.obs.pods:
                ps.d.actions.append(DeleteLease(lease.name))
            continue
        if not renewing or not lease.recreated:
            continue
        why = f"slot {slot} is attempt {current} now; pod {lease.name} (attempt {attempt}) is stale"
        ps.d.actions.append(FenceLease(lease.name, why))
        ps.event(WARNING, reasons.STALE_POD_FENCED, f"{why} and still heartbeats: fenced, it stops itself")
