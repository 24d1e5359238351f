"""`python -m rtj uninstall-cleanup`: what is left of the operator in the cluster, undone once it is
gone. The chart's post-delete hook runs it (templates/uninstall-hook.yaml); with the hook off, an
admin can run it by hand (any kubeconfig with the hook's rights).

Once the operator is uninstalled nothing would lift its quarantines, nor run its finalizer's cleanup:
1. Every node loses every quarantine of ours (rtj.ladder.quarantine.lift_patch: our taint and our
   record; every other taint stays), patched under the node's resourceVersion and read again on a
   Conflict (rtj.kube.Kube.patch_node).
2. Every job holding our finalizer (contract.FINALIZER, kopf's, put only on jobs with an FSx PV) is
   released, so that deleting it, or its namespace, never waits for an operator that is gone. Only
   our finalizer is removed; other finalizers stay. No user data is lost either way:
   - a job being deleted first gets the cleanup the operator's delete handler gives it: every PV
     whose labels name the job deleted (rtj.kube.Kube.delete_fsx_pvs, each under its UID), whatever
     its name (an earlier operator's `rtj-<ns>-<job>-fsx` too); never a PV of another job. The PVs'
     reclaim policy is Retain: the file system and its checkpoints are never touched;
   - a job not being deleted keeps its PV (its pods may still mount it); only the finalizer goes. Its
     line says how to delete its PVs by label once the job is deleted later. An operator installed
     again puts the finalizer back on a job that still exists.
One line per node and job; exit 0 when no node keeps a quarantine of ours and no job our finalizer
(checked by listing them again at the end), else 1, the last line naming what is left.

Run it only once no operator runs: a running one puts its finalizer back on a live job at once and
may quarantine a node again. The chart's hook runs after Helm deleted the operator's Deployment and
its RBAC.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rtj import builders, contract, kube
from rtj.ladder import quarantine

COMMAND = "uninstall-cleanup"
#: Read-modify-write rounds of a job's finalizer patch before a Conflict is given up.
JOB_PATCH_ATTEMPTS = 5
EXIT_LEFT = 1


@dataclass(frozen=True)
class Outcome:
    """One line of the report: a node, a job, or a list that failed."""

    subject: str
    message: str
    ok: bool = True

    def line(self) -> str:
        return f"{self.subject}: {self.message}"


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _error(exc: Exception) -> str:
    if isinstance(exc, kube.KubeError):
        return f"{exc.server_reason}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


# --- nodes ----------------------------------------------------------------------------------------------
async def _quarantined_nodes(k: kube.Kube) -> list[dict[str, Any]]:
    return [n for n in await k.list_objects("Node", None) if quarantine.lift_patch(n) is not None]


async def _lift(k: kube.Kube, node: dict[str, Any]) -> Outcome:
    name = str(_meta(node).get("name"))
    taints = (node.get("spec") or {}).get("taints") or []
    ours = [t for t in taints if t.get("key") == contract.QUARANTINE_TAINT_KEY]
    was = f"taint {contract.QUARANTINE_TAINT_KEY}={ours[0].get('value', '')}" if ours else "record only"
    try:
        lifted = await k.patch_node(name, quarantine.lift_patch)
    except Exception as exc:
        return Outcome(f"node {name}", f"quarantine NOT lifted ({was}): {_error(exc)}", ok=False)
    return Outcome(f"node {name}", f"quarantine lifted ({was})" if lifted else "quarantine already gone")


async def lift_quarantines(k: kube.Kube) -> list[Outcome]:
    """Every quarantine of ours lifted, one outcome per node that had one."""
    try:
        nodes = await _quarantined_nodes(k)
    except Exception as exc:
        return [Outcome("nodes", f"not listed: {_error(exc)}", ok=False)]
    return list(await asyncio.gather(*(_lift(k, n) for n in nodes)))


# --- jobs -----------------------------------------------------------------------------------------------
async def _held_jobs(k: kube.Kube, namespaces: Sequence[str]) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = []
    scopes: list[str | None] = [*namespaces] or [None]  # None: every namespace
    for namespace in scopes:
        items = await k.list_objects("Job", namespace)
        jobs += [j for j in items if contract.FINALIZER in (_meta(j).get("finalizers") or [])]
    return jobs


async def _delete_pvs(k: kube.Kube, namespace: str, name: str) -> str:
    """The cleanup a deleted job gets from the operator (rtj.handlers.cleanup): every PV whose labels
    name the job deleted, each under its UID."""
    deleted = await k.delete_fsx_pvs(namespace, name)
    if not deleted:
        return "no PV of the job left"
    return f"PV {', '.join(deleted)} deleted (reclaim policy Retain: the file system is untouched)"


async def _remove_finalizer(k: kube.Kube, job: dict[str, Any]) -> bool:
    """Our finalizer removed, the others kept, under the job's resourceVersion (read again on a
    Conflict). False: the job is gone, or no longer holds it."""
    namespace, name = str(_meta(job).get("namespace")), str(_meta(job).get("name"))
    current: dict[str, Any] | None = job
    for attempt in range(JOB_PATCH_ATTEMPTS):
        if current is None:
            return False
        finalizers = list(_meta(current).get("finalizers") or [])
        if contract.FINALIZER not in finalizers:
            return False
        patch = {
            "metadata": {
                "resourceVersion": _meta(current).get("resourceVersion"),
                "finalizers": [f for f in finalizers if f != contract.FINALIZER],
            }
        }
        try:
            return await k.patch("Job", namespace, name, patch)
        except kube.KubeError as exc:
            if not exc.conflict or attempt == JOB_PATCH_ATTEMPTS - 1:
                raise
        current = await k.get("Job", namespace, name)
    return False


async def _release(k: kube.Kube, job: dict[str, Any], delete_pvs: bool) -> Outcome:
    meta = _meta(job)
    namespace, name = str(meta.get("namespace")), str(meta.get("name"))
    subject = f"job {namespace}/{name}"
    deleting = bool(meta.get("deletionTimestamp"))
    fsx = bool(((job.get("spec") or {}).get("checkpoint") or {}).get("fsx"))
    selector = builders.fsx_pv_selector(namespace, name)
    try:
        if not fsx:
            pv = "no FSx PV"
        elif not deleting:
            pv = f"its PV kept, the job still exists (once it is deleted: kubectl delete pv -l {selector})"
        elif delete_pvs:
            pv = await _delete_pvs(k, namespace, name)
        else:
            pv = f"its PV not looked at (--keep-pvs; kubectl delete pv -l {selector})"
        removed = await _remove_finalizer(k, job)
    except Exception as exc:
        return Outcome(subject, f"finalizer NOT removed: {_error(exc)}", ok=False)
    state = "being deleted" if deleting else "not being deleted"
    return Outcome(subject, f"{state}; {'finalizer removed' if removed else 'finalizer already gone'}; {pv}")


async def release_jobs(k: kube.Kube, namespaces: Sequence[str], delete_pvs: bool) -> list[Outcome]:
    """Every job of `namespaces` (all when empty) released from our finalizer, one outcome per job."""
    try:
        jobs = await _held_jobs(k, namespaces)
    except Exception as exc:
        return [Outcome("jobs", f"not listed: {_error(exc)}", ok=False)]
    return list(await asyncio.gather(*(_release(k, j, delete_pvs) for j in jobs)))


# --- the command ------------------------------------------------------------------------------------------
async def what_is_left(k: kube.Kube, namespaces: Sequence[str]) -> list[str]:
    """Nodes still quarantined by us and jobs still holding our finalizer (listed again)."""
    try:
        left = [f"node {_meta(n).get('name')}" for n in await _quarantined_nodes(k)]
        left += [
            f"job {_meta(j).get('namespace')}/{_meta(j).get('name')}" for j in await _held_jobs(k, namespaces)
        ]
    except Exception as exc:
        return [f"(not listed again: {_error(exc)})"]
    return left


async def cleanup(
    k: kube.Kube, namespaces: Sequence[str], delete_pvs: bool
) -> tuple[list[Outcome], list[str]]:
    """(one outcome per node and job, what is left afterwards)."""
    outcomes = await lift_quarantines(k)
    outcomes += await release_jobs(k, namespaces, delete_pvs)
    return outcomes, await what_is_left(k, namespaces)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m rtj {COMMAND}",
        description="Lift every quarantine of ours from every node and release every job from the "
        "operator's finalizer (deleting the FSx PV of a job being deleted). Run once no operator runs.",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="release jobs in this namespace only (repeatable; default: all namespaces). Nodes: always all.",
    )
    parser.add_argument(
        "--keep-pvs",
        action="store_true",
        help="never read nor delete PersistentVolumes (without fsx.enabled the operator created none)",
    )
    parser.add_argument("--request-timeout", type=float, default=10.0, help="seconds per API request")
    return parser.parse_args(list(argv))


def report(outcomes: Sequence[Outcome], left: Sequence[str]) -> tuple[list[str], int]:
    """(the lines to print, the exit code): one line per node and job, then a summary naming what
    failed and what is left; 0 only when nothing failed and nothing is left."""
    outcomes = sorted(outcomes, key=lambda o: o.subject)
    lines = [o.line() for o in outcomes]
    nodes = sum(1 for o in outcomes if o.ok and o.subject.startswith("node "))
    jobs = sum(1 for o in outcomes if o.ok and o.subject.startswith("job "))
    summary = f"{COMMAND}: {nodes} node(s) and {jobs} job(s) done"
    failed = ", ".join(o.subject for o in outcomes if not o.ok)
    if failed or left:
        lines.append(f"{summary}; FAILED: {failed or '-'}; still left: {', '.join(left) or '-'}")
        return lines, EXIT_LEFT
    lines.append(f"{summary}; nothing left")
    return lines, 0


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    k = kube.Kube.from_environment(args.request_timeout)
    try:
        outcomes, left = asyncio.run(cleanup(k, args.namespace, not args.keep_pvs))
    finally:
        k.close()
    lines, code = report(outcomes, left)
    print("\n".join(lines), flush=True)
    return code
