"""A live, readable timeline of one ResilientTrainingJob, for `make demo` and e2e test logs.

`Timeline.poll()` reads the job (conditions, restart counters per ladder level, last checkpoint,
node slots, quarantined nodes), its heartbeat Leases (per-pod state, step, heartbeat age), its pods
and its Events, and returns the lines worth printing since the last poll: a status block whenever
something other than steps and heartbeat ages changed, every new Event, and a progress block every
`progress_every` seconds. `note()` adds the caller's own lines (e.g. "injecting a fault").
Everything it saw is kept in `history` for summaries and assertions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rtj.contract import (
    API_GROUP,
    API_VERSION,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_ROLE,
    LABEL_SLOT,
    PLURAL,
    ROLE_WORKER,
    parse_heartbeat,
    parse_time,
)

from rtj_local.rawapi import RawApi


@dataclass
class Snapshot:
    """What one poll saw."""

    t: float  # seconds since the timeline started
    job: dict[str, Any] | None
    leases: dict[str, dict[str, Any]]  # pod name -> {state, step, checkpoint, age, ...}
    pods: dict[str, dict[str, Any]]  # pod name -> {phase, node, exit_code, slot, attempt, ip, ...}

    @property
    def status(self) -> dict[str, Any]:
        return (self.job or {}).get("status") or {}

    @property
    def slots(self) -> list[dict[str, Any]]:
        """Every node slot as status.nodeSlots entries: the operator's own entry where status shows
        one (the slots that are not plainly healthy), else the slot's newest worker pod, its node and
        its heartbeat's state, as `kubectl get pods -l` and the Leases show them (a big job's status
        lists only a few slots whole)."""
        shown = {s.get("slot"): s for s in self.status.get("nodeSlots") or []}
        newest: dict[int, tuple[int, str]] = {}
        for name, pod in self.pods.items():
            slot, attempt = pod.get("slot"), pod.get("attempt")
            if slot is not None and attempt is not None and attempt >= newest.get(slot, (-1, ""))[0]:
                newest[slot] = (attempt, name)
        nodes = int(((self.job or {}).get("spec") or {}).get("nodes") or 0)
        out = []
        for slot in range(max(nodes, len(shown))):
            if slot in shown:
                out.append(shown[slot])
                continue
            attempt, name = newest.get(slot, (0, ""))
            out.append(
                {
                    "slot": slot,
                    "pod": name,
                    "node": self.pods.get(name, {}).get("node", ""),
                    "attempt": attempt,
                    "state": self.leases.get(name, {}).get("state", "") if name else "",
                }
            )
        return out

    def condition(self, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status.get("conditions") or [] if c.get("type") == type_), None)

    def is_true(self, type_: str) -> bool:
        c = self.condition(type_)
        return c is not None and c.get("status") == "True"

    @property
    def restarts(self) -> dict[str, int]:
        r = self.status.get("restarts") or {}
        return {k: int(r.get(k, 0)) for k in ("inProcess", "inJob", "inPlace", "podReschedules", "job")}

    @property
    def checkpoint_step(self) -> int | None:
        ckpt = self.status.get("lastCheckpoint")
        return int(ckpt["step"]) if ckpt else None


@dataclass
class Timeline:
    raw: RawApi
    namespace: str
    job: str
    progress_every: float = 10.0
    t0: float = field(default_factory=time.monotonic)
    wall0: float = field(default_factory=time.time)  # the wall-clock time of t0
    history: list[Snapshot] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    _seen_events: set[str] = field(default_factory=set)
    _signature: Any = None
    _last_progress: float = -1e9

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _stamp(self, t: float | None = None) -> str:
        return f"t+{self.elapsed() if t is None else t:6.1f}s"

    def note(self, text: str) -> str:
        return f"{self._stamp()}  >>> {text}"

    # --- reading ------------------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        ns = self.namespace
        job = self.raw.get(f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{ns}/{PLURAL}/{self.job}")
        now = datetime.now(UTC)
        leases: dict[str, dict[str, Any]] = {}
        for lease in self.raw.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")["items"]:
            name = lease["metadata"]["name"]
            if not name.startswith(f"{self.job}-"):
                continue
            hb = parse_heartbeat(lease["metadata"].get("annotations"))
            renew = parse_time((lease.get("spec") or {}).get("renewTime"))
            leases[name] = {
                "state": hb.state.value if hb else "?",
                "step": hb.step if hb else None,
                "checkpoint": hb.checkpoint.step if hb and hb.checkpoint else None,
                "replica": hb.replica_step if hb else None,
                "in_process": hb.in_process_restarts if hb else 0,
                "in_job": hb.in_job_restarts if hb else 0,
                "fault": hb.fault.reason if hb and hb.fault else "",
                "age": (now - renew).total_seconds() if renew else None,
            }
        pods: dict[str, dict[str, Any]] = {}
        selector = f"{LABEL_JOB}={self.job}"
        for pod in self.raw.request("GET", f"/api/v1/namespaces/{ns}/pods", labelSelector=selector)["items"]:
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            terminated = (statuses[0].get("state") or {}).get("terminated") or {}
            last = (statuses[0].get("lastState") or {}).get("terminated") or {}
            labels = pod["metadata"].get("labels") or {}
            worker = labels.get(LABEL_ROLE) == ROLE_WORKER
            pods[pod["metadata"]["name"]] = {
                "slot": _int(labels.get(LABEL_SLOT)) if worker else None,
                "attempt": _int(labels.get(LABEL_ATTEMPT)) if worker else None,
                "phase": (pod.get("status") or {}).get("phase", ""),
                "node": (pod.get("spec") or {}).get("nodeName") or "",
                "exit_code": terminated.get("exitCode"),
                # The trainer container's restarts in place (the kubelet's count) and the exit before
                # the last one; the pod's IP (an in-place restart keeps it).
                "container_restarts": int(statuses[0].get("restartCount") or 0),
                "last_exit_code": last.get("exitCode"),
                "last_reason": last.get("reason") or "",
                "ip": (pod.get("status") or {}).get("podIP") or "",
                "deleting": bool(pod["metadata"].get("deletionTimestamp")),
                "uid": pod["metadata"]["uid"],
            }
        snap = Snapshot(self.elapsed(), job, leases, pods)
        self.history.append(snap)
        return snap

    def _new_events(self) -> list[dict[str, Any]]:
        items = self.raw.request(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/events",
            fieldSelector=f"involvedObject.name={self.job}",
        )["items"]
        fresh = []
        for ev in sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
            key = f"{ev['metadata']['uid']}/{ev.get('count', 1)}"
            if key not in self._seen_events:
                self._seen_events.add(key)
                fresh.append(ev)
        self.events.extend(fresh)
        return fresh

    # --- rendering ----------------------------------------------------------------------------------
    def poll(self) -> list[str]:
        snap = self.snapshot()
        stamp = self._stamp(snap.t)
        lines = [
            f"{stamp}  event {ev.get('type', '')} {ev.get('reason', '')}: {ev.get('message', '')}"
            for ev in self._new_events()
        ]
        signature = self._signature_of(snap)
        if signature != self._signature or snap.t - self._last_progress >= self.progress_every:
            self._signature = signature
            self._last_progress = snap.t
            lines += self.render(snap)
        return lines

    @staticmethod
    def _signature_of(snap: Snapshot) -> Any:
        st = snap.status
        conditions = tuple(
            (c.get("type"), c.get("status"), c.get("reason")) for c in st.get("conditions") or []
        )
        slots = tuple((s.get("slot"), s.get("pod"), s.get("node"), s.get("state")) for s in snap.slots)
        pods = tuple(sorted((n, p["phase"], p["node"], p["deleting"]) for n, p in snap.pods.items()))
        return (
            conditions,
            tuple(snap.restarts.items()),
            snap.checkpoint_step,
            slots,
            tuple(st.get("quarantinedNodes") or []),
            pods,
        )

    def render(self, snap: Snapshot) -> list[str]:
        if snap.job is None:
            return [f"{self._stamp(snap.t)}  job {self.namespace}/{self.job}: not found"]
        st = snap.status
        true = [
            f"{c['type']}({c.get('reason', '')})"
            for c in st.get("conditions") or []
            if c.get("status") == "True"
        ]
        r = snap.restarts
        ckpt = snap.checkpoint_step
        conditions = ", ".join(true) or "no condition true"
        head = (
            f"{self._stamp(snap.t)}  {st.get('state') or '-':<11} {conditions:<44}"
            f" restarts: in-process {r['inProcess']}, in-job {r['inJob']}, in-place {r['inPlace']},"
            f" pods {r['podReschedules']},"
            f" job {r['job']}"
            f" | checkpoint {'step ' + str(ckpt) if ckpt is not None else '-'}"
        )
        lines = [head]
        for s in snap.slots:
            pod = s.get("pod", "")
            hb = snap.leases.get(pod, {})
            age = hb.get("age")
            node, state = s.get("node") or "-", s.get("state") or "-"
            lines.append(
                f"{'':10}slot {s.get('slot')}  {pod:<22} {node:<12} {state:<20}"
                f" step {hb.get('step') if hb.get('step') is not None else '-':>4}"
                f"  heartbeat {f'{age:4.1f}s ago' if age is not None else '-':<10}"
                f" restarts ip/ij {hb.get('in_process', 0)}/{hb.get('in_job', 0)}"
                + (f"  fault {hb['fault']}" if hb.get("fault") else "")
                + (
                    f"  container restarts {n}"
                    if (n := snap.pods.get(pod, {}).get("container_restarts"))
                    else ""
                )
            )
        in_slots = {s.get("pod") for s in snap.slots}
        others = [
            f"{n} {p['phase']}@{p['node'] or '-'}"
            + (" (deleting)" if p["deleting"] else "")
            + (f" exit {p['exit_code']}" if p["exit_code"] is not None else "")
            for n, p in sorted(snap.pods.items())
            if n not in in_slots
        ]
        if others:
            lines.append(f"{'':10}other pods: {'; '.join(others)}")
        if st.get("quarantinedNodes"):
            lines.append(f"{'':10}quarantined nodes: {', '.join(st['quarantinedNodes'])}")
        return lines


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
