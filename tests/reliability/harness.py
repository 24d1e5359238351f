"""Drives many jobs at once against the real operator process, as their trainers and kubelets would.

- `Fleet`: the jobs of one test in one namespace. `tick()` reads all pods with one LIST, renews the
  heartbeat Lease of every running pod (through rtj.contract, as the trainer's agent does; in
  parallel), then lets each job's `Script` take its next step (inject its fault, finish its pods).
- `SlotWatch`: a pod watch in a thread that checks, on every event, that no (job, slot) ever has two
  live (not terminal, not terminating) worker pods; violations are kept for the test to assert.
- `leaks()`: what a deleted job left behind (pods, services, leases, PVCs, PVs, quarantine taints on
  the nodes named); `quarantine_taints()`: the reasons a node is quarantined for.

The operator process and the trainers' Lease writer come from tests/integration/operator_harness.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from integration.operator_harness import Trainers, end_pod
from kubernetes import client, watch
from rtj import contract

RESCHEDULE = "reschedule"


@dataclass
class Script:
    """One job's life: start, one injected fault (or none), finish with an exit code."""

    name: str
    fault: str  # none | soft | delete | silence | exit70 | exit93 | node
    expect_state: str  # Succeeded | Failed
    expect_restarts: tuple[int, int, int]  # in-process, in-job, pod reschedules
    fault_delay: float = 0.0
    step: str = "starting"  # starting -> faulted -> finishing -> done
    t_running: float = 0.0
    injected: str = ""  # pod or node the fault hit
    #: Rendezvous pods lost with another job's faulty node while this job had not yet finished:
    #: each is recreated as a job restart (RendezvousLost); losses within one job-level window
    #: (2 x heartbeatTimeoutSeconds) are one incident, so 1..rendezvous_lost job restarts.
    rendezvous_lost: int = 0
    #: Rendezvous pods lost while this job was already ending: the operator may or may not have
    #: counted one before it saw the job end (both are right), so the final check allows either.
    job_slack: int = 0
    #: 1 when a rendezvous loss came while this job's own worker fault (silence, exit70) was not
    #: yet acted on: that fault is then part of the job-level incident, no pod reschedule.
    own_fault_slack: int = 0
    log: list[str] = field(default_factory=list)


class Fleet:
    def __init__(
        self,
        kube: client.ApiClient,
        namespace: str,
        on_node_fault: Callable[[str], None],
        interval: float = 2.0,
        heartbeat_timeout: float = 45.0,
    ) -> None:
        self.core = client.CoreV1Api(kube)
        self.custom = client.CustomObjectsApi(kube)
        self.namespace = namespace
        self.trainers = Trainers(self.core, client.CoordinationV1Api(kube), namespace, job="")
        self.scripts: dict[str, Script] = {}
        self.on_node_fault = on_node_fault
        #: The jobs' faultTolerance.heartbeatTimeoutSeconds (sets the job-level window).
        self.heartbeat_timeout = heartbeat_timeout
        self.pool = ThreadPoolExecutor(8)
        self.beats = 0
        #: Each pod's Lease is renewed about every `interval` seconds (pod UID -> last renewal).
        self.interval = interval
        self.last_beat: dict[str, float] = {}

    # --- jobs -------------------------------------------------------------------------------------
    def job(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, self.namespace, contract.PLURAL, name
        )

    def jobs(self) -> dict[str, dict[str, Any]]:
        items = self.custom.list_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, self.namespace, contract.PLURAL
        )["items"]
        return {j["metadata"]["name"]: j for j in items}

    def pods(self) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=contract.LABEL_JOB).items

    # --- one tick ----------------------------------------------------------------------------------
    def tick(self) -> bool:
        """Heartbeats, then each job's next step; True once every script is done."""
        pods = self.pods()
        by_job: dict[str, list[client.V1Pod]] = {}
        for pod in pods:
            by_job.setdefault(pod.metadata.labels[contract.LABEL_JOB], []).append(pod)
        now = time.monotonic()
        beating = [
            p
            for p in pods
            if p.metadata.labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER
            and p.status.phase == "Running"
            and not p.metadata.deletion_timestamp
            and p.metadata.name not in self.trainers.silent
            and (
                now - self.last_beat.get(p.metadata.uid, 0) >= self.interval
                or p.metadata.name in self.trainers.heartbeats
            )
        ]
        for p in beating:
            self.last_beat[p.metadata.uid] = now
        list(self.pool.map(self._beat, beating))
        self.beats += len(beating)
        jobs = self.jobs()
        for script in self.scripts.values():
            if script.step != "done":
                self._advance(script, by_job.get(script.name, []), jobs.get(script.name))
        return all(s.step == "done" for s in self.scripts.values())

    def _beat(self, pod: client.V1Pod) -> None:
        job = pod.metadata.labels[contract.LABEL_JOB]
        hb = self.trainers.heartbeats.get(pod.metadata.name) or contract.Heartbeat(
            state=contract.PodState.TRAINING
        )
        writer = Trainers(self.core, self.trainers.coord, self.namespace, job)
        try:
            writer.write_lease(pod, hb)
        except client.ApiException as exc:  # the pod went away between the LIST and the write
            if exc.status not in (404, 409, 422):
                raise

    def _advance(self, s: Script, pods: list[client.V1Pod], job: dict[str, Any] | None) -> None:
        workers = {
            p.metadata.name: p
            for p in pods
            if p.metadata.labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER
            and not p.metadata.deletion_timestamp
        }
        running = [p for p in workers.values() if p.status.phase == "Running"]
        now = time.monotonic()
        status = (job or {}).get("status") or {}
        counts = status.get("restarts") or {}
        # Pods replaced: for a fault (podReschedules) or after a delete by someone else (disruptions).
        reschedules = (counts.get("podReschedules") or 0) + (counts.get("disruptions") or 0)
        if s.step == "starting":
            # A lost rendezvous pod is counted, and its job-level window has passed, before this
            # job's own fault (or end) is injected: that fault is then the pod's own.
            if (
                len(running) == 2
                and status.get("nodesReady") == 2
                and ((status.get("restarts") or {}).get("job") or 0) >= min(1, s.rendezvous_lost)
                and not self._in_job_window(status)
            ):
                s.t_running = s.t_running or now
                if now - s.t_running >= s.fault_delay:
                    self._inject(s, sorted(running, key=lambda p: p.metadata.name))
                    s.step = "faulted"
            return
        if s.step == "faulted":
            if s.fault != "exit93" and reschedules < s.expect_restarts[2] - s.own_fault_slack:
                return  # the replacement not yet counted
            if s.fault in ("delete", "silence", "exit70", "node"):
                # Finished once the slot's replacement (attempt 1) runs and heartbeats.
                if status.get("nodesReady") != 2:
                    return
            elif s.fault == "soft":
                r = status.get("restarts") or {}
                if (r.get("inProcess"), r.get("inJob")) != (2, 1):
                    return
            if s.expect_state == "Failed":
                if self._is(job, "Failed"):
                    s.step = "done"
                return
            if len(running) != 2:
                # A replacement counted ready before it shows Running (seen when a rendezvous loss
                # came during this job's own fault): ending only the pod that runs would leave the
                # replacement running, never ended, and the job never finishing.
                return
            for pod in running:
                end_pod(self.core, self.namespace, pod.metadata.name, 0)
            s.log.append(f"finish {sorted(p.metadata.name for p in running)}")
            s.step = "finishing"
            return
        if s.step == "finishing" and (self._is(job, "Succeeded") or self._is(job, "Failed")):
            s.step = "done"

    def _in_job_window(self, status: dict[str, Any]) -> bool:
        """Within the job-level window (rtj.ladder.job_level) of this job's last rendezvous loss."""
        began = contract.parse_time(status.get("jobFaultTime"))
        if began is None:
            return False
        return (datetime.now(UTC) - began).total_seconds() <= 2 * self.heartbeat_timeout + 2

    @staticmethod
    def _is(job: dict[str, Any] | None, type_: str) -> bool:
        return any(
            c.get("type") == type_ and c.get("status") == "True"
            for c in ((job or {}).get("status") or {}).get("conditions") or []
        )

    def _inject(self, s: Script, running: list[client.V1Pod]) -> None:
        target = running[0]
        s.injected = target.metadata.name
        if s.fault == "soft":
            self.trainers.heartbeats[target.metadata.name] = contract.Heartbeat(
                state=contract.PodState.TRAINING, in_process_restarts=2, in_job_restarts=1
            )
        elif s.fault == "delete":
            self.core.delete_namespaced_pod(target.metadata.name, self.namespace)
        elif s.fault == "silence":
            self.trainers.silent.add(target.metadata.name)
        elif s.fault == "exit70":
            end_pod(
                self.core, self.namespace, target.metadata.name, contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED
            )
        elif s.fault == "exit93":
            end_pod(self.core, self.namespace, target.metadata.name, contract.ExitCode.DO_NOT_RESTART)
        elif s.fault == "node":
            s.injected = target.spec.node_name
            # Every job's rendezvous pod on that node (rendezvous pods have no node selector) is lost
            # with it: recreated, a job restart (RendezvousLost).
            for pod in self.pods():
                other = self.scripts.get(pod.metadata.labels.get(contract.LABEL_JOB, ""))
                if (
                    other is not None
                    and pod.metadata.labels.get(contract.LABEL_ROLE) == contract.ROLE_RENDEZVOUS
                    and pod.spec.node_name == target.spec.node_name
                    and not pod.metadata.deletion_timestamp
                ):
                    if other.step == "starting" or (other.step == "faulted" and other.fault != "exit93"):
                        other.rendezvous_lost += 1
                        if other.step == "faulted" and other.fault in ("silence", "exit70"):
                            other.own_fault_slack = 1
                        other.log.append(f"rendezvous lost with node {target.spec.node_name}")
                    else:
                        other.job_slack += 1
                        other.log.append(f"rendezvous lost with node {target.spec.node_name} while ending")
            self.on_node_fault(target.spec.node_name)
        s.log.append(f"fault {s.fault} -> {s.injected}")

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class SlotWatch:
    """Watches the namespace's pods; on every event checks one live worker pod per (job, slot)."""

    def __init__(self, kube: client.ApiClient, namespace: str) -> None:
        self.core = client.CoreV1Api(kube)
        self.namespace = namespace
        self.pods: dict[str, client.V1Pod] = {}
        self.violations: list[str] = []
        self.events = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> SlotWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.core.list_namespaced_pod,
                    self.namespace,
                    label_selector=f"{contract.LABEL_ROLE}={contract.ROLE_WORKER}",
                    resource_version=rv,
                    timeout_seconds=5,
                ):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    if ev["type"] == "DELETED":
                        self.pods.pop(pod.metadata.name, None)
                    else:
                        self.pods[pod.metadata.name] = pod
                    self.events += 1
                    self._check()
                    if self._stop.is_set():
                        break
            except client.ApiException as exc:
                if exc.status == 410:  # expired: relist
                    rv = None
                    self.pods.clear()
                else:
                    time.sleep(0.2)  # the API server is restarting (outage tests); retry the watch
            except Exception:  # connection reset during an outage
                time.sleep(0.2)

    def _check(self) -> None:
        live: dict[tuple[str, str], list[str]] = {}
        for pod in self.pods.values():
            if pod.metadata.deletion_timestamp or pod.status.phase in ("Succeeded", "Failed"):
                continue
            key = (
                pod.metadata.labels.get(contract.LABEL_JOB, ""),
                pod.metadata.labels.get(contract.LABEL_SLOT, ""),
            )
            live.setdefault(key, []).append(pod.metadata.name)
        for key, names in live.items():
            if len(names) > 1:
                self.violations.append(f"{key}: {sorted(names)}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def leaks(kube: client.ApiClient, namespace: str, nodes: list[str]) -> list[str]:
    core = client.CoreV1Api(kube)
    sel = contract.LABEL_JOB
    out = [
        f"pod {p.metadata.name} ({p.status.phase} on {p.spec.node_name or 'no node'}"
        f"{', terminating' if p.metadata.deletion_timestamp else ''})"
        for p in core.list_namespaced_pod(namespace, label_selector=sel).items
    ]
    out += [
        f"service {s.metadata.name}"
        for s in core.list_namespaced_service(namespace, label_selector=sel).items
    ]
    out += [
        f"lease {x.metadata.name}"
        for x in client.CoordinationV1Api(kube).list_namespaced_lease(namespace, label_selector=sel).items
    ]
    out += [f"pvc {c.metadata.name}" for c in core.list_namespaced_persistent_volume_claim(namespace).items]
    out += [
        f"pv {v.metadata.name}"
        for v in core.list_persistent_volume(
            label_selector=f"{contract.API_GROUP}/job-namespace={namespace}"
        ).items
    ]
    out += [
        f"taint {contract.QUARANTINE_TAINT_KEY}={v} on {n}" for n in nodes for v in quarantine_taints(core, n)
    ]
    return out


def quarantine_taints(core: client.CoreV1Api, name: str) -> list[str]:
    """The values (reasons) of the quarantine taints on node `name`; none for a node that is gone."""
    try:
        node = core.read_node(name)
    except client.ApiException:
        return []
    return [t.value for t in node.spec.taints or [] if t.key == contract.QUARANTINE_TAINT_KEY]
