"""NodeAgent: runs the pods bound to its Nodes as local process groups. LOCAL USE ONLY (see the
package's docstring). Three threads: the node heartbeat (Leases, node status, token refresh, kill-node
requests from other processes), the pod watch, the /etc/hosts refresh; and one thread per pod, which
prepares its inputs, starts its launcher, restarts it as its restartPolicy says and reports its status."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from rtj_local.node_agent.cluster_hosts import hosts_text, rewrite_in_place
from rtj_local.node_agent.mount_namespaces import await_pod_namespace, pids_in_namespace
from rtj_local.node_agent.node_heartbeat import NodeHeartbeat
from rtj_local.node_agent.pod_inputs import PodInputs
from rtj_local.node_agent.pod_state import PodRun, dig, now
from rtj_local.node_agent.pod_status import PodStatusReporter
from rtj_local.nodes import P5_RESOURCES
from rtj_local.podrun import (
    MissingReference,
    PlanContext,
    PodSpecError,
    ProcessPlan,
    host_mount_points,
    launcher_argv,
    plan_pod,
)
from rtj_local.procs import ProcInfo, read_process
from rtj_local.rawapi import RawApi
from rtj_local.versions import REPO_ROOT

log = logging.getLogger("rtj_local.node_agent")

DEFAULT_PREFIX = "local-p5-"
DEFAULT_NODE_NAMES = tuple(f"{DEFAULT_PREFIX}{i}" for i in range(3))
KILL_NODE_REQUEST = "kill-node-"  # a file `control/kill-node-<node>` in the run dir


def request_kill_node(run_dir: Path, node: str) -> None:
    """Asks the agent running with `run_dir` (another process) to kill `node`."""
    (Path(run_dir) / "control" / f"{KILL_NODE_REQUEST}{node}").touch()


class NodeAgent:
    """Runs pods bound to `node_names` as local processes. LOCAL USE ONLY; see the package docstring."""

    def __init__(
        self,
        kubeconfig: Path,
        run_dir: Path,
        node_names: Iterable[str] = DEFAULT_NODE_NAMES,
        venv: Path = REPO_ROOT / ".venv",
        lease_duration_seconds: int = 40,
        renew_interval_seconds: float = 2.0,
        status_interval_seconds: float = 10.0,
        delete_nodes_on_stop: bool = True,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.run_dir = Path(run_dir).resolve()
        self.node_names = list(node_names)
        self.venv_bin = str(Path(venv).resolve() / "bin")
        self.renew_interval_seconds = renew_interval_seconds
        self.status_interval_seconds = status_interval_seconds
        self.delete_nodes_on_stop = delete_nodes_on_stop
        self.hosts_file = self.run_dir / "hosts"
        self.control_dir = self.run_dir / "control"
        self._lock = threading.RLock()
        self._runs: dict[str, PodRun] = {}
        self._dead: set[str] = set()
        self._created_host_dirs: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self._api.configuration.connection_pool_maxsize = 32
        self.core = client.CoreV1Api(self._api)  # for the pod watch
        raw = RawApi(self._api)
        self.request = raw.request
        self.nodes = NodeHeartbeat(raw, lease_duration_seconds)
        self.inputs = PodInputs(raw, self.run_dir)
        self.status = PodStatusReporter(raw)
        server = urlparse(self._api.configuration.host)
        self.apiserver_host = server.hostname or "127.0.0.1"
        self.apiserver_port = server.port or 443

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.control_dir.mkdir(exist_ok=True)
        self._refresh_hosts()
        for name in self.node_names:
            self.nodes.register(name)
        for target in (self._heartbeat_loop, self._pod_loop, self._hosts_loop):
            t = threading.Thread(target=target, name=f"node-agent-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)
        log.info("node agent up: nodes %s, run dir %s", self.node_names, self.run_dir)
        return self

    def stop(self) -> None:
        """Kills every pod process, stops renewing, removes the mount points it created on the host
        and (by default) deletes its Nodes."""
        self._stop.set()
        with self._lock:
            runs = list(self._runs.values())
            for run in runs:
                run.abandoned = True
        for run in runs:
            self._kill_all(run)
        for path in sorted(self._created_host_dirs, key=lambda p: -p.count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        if self.delete_nodes_on_stop:
            for name in self.node_names:
                self.nodes.delete(name)
        self._api.close()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_node(self, name: str) -> list[str]:
        """Node death: SIGKILL every process of every pod on `name` and stop its heartbeats. Returns
        the names of the pods killed."""
        if name not in self.node_names:
            raise ValueError(f"{name!r} is not a node of this agent ({self.node_names})")
        with self._lock:
            self._dead.add(name)
            runs = [r for r in self._runs.values() if r.node == name]
            for run in runs:
                run.abandoned = True
        for run in runs:
            self._kill_all(run)
        log.warning("node %s killed (pods: %s)", name, [r.name for r in runs])
        return [f"{r.namespace}/{r.name}" for r in runs]

    def is_dead(self, name: str) -> bool:
        return name in self._dead

    def revive_node(self, name: str) -> None:
        """A dead node repaired (rebooted empty, as after an admin's repair): its heartbeats resume and
        the node lifecycle controller lifts its unreachable taints. The pods it ran are not restarted:
        delete them first (as Jobs.cleanup does); any left are forgotten."""
        if name not in self.node_names:
            raise ValueError(f"{name!r} is not a node of this agent ({self.node_names})")
        with self._lock:
            stale = [r for r in self._runs.values() if r.node == name]
            for run in stale:
                self._runs.pop(run.uid, None)
            self._dead.discard(name)
        self.nodes.renew_lease(name)
        self.nodes.post_status(name)
        log.warning("node %s revived", name)

    # --- introspection (for tests and the demo) -------------------------------------------------------
    def pod_dir(self, namespace: str, name: str) -> Path | None:
        with self._lock:
            for run in self._runs.values():
                if (run.namespace, run.name) == (namespace, name):
                    return run.pod_dir
        return None

    def pod_processes(self, namespace: str, name: str) -> list[ProcInfo]:
        """Every live process of a running pod, with its command line and initial environment."""
        with self._lock:
            run = next((r for r in self._runs.values() if (r.namespace, r.name) == (namespace, name)), None)
        if run is None or run.mnt_ns is None:
            return []
        return [p for p in map(read_process, pids_in_namespace(run.mnt_ns)) if p is not None]

    def pvc_dir(self, namespace: str, claim: str) -> Path:
        """The local directory backing a PVC (as mounted into pods)."""
        return Path(self.inputs.pvc_source(namespace, claim))

    # --- background loops -----------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self._stop.wait(self.renew_interval_seconds):
            live = [n for n in self.node_names if n not in self._dead]
            try:
                for name in live:
                    self.nodes.renew_lease(name)
                if time.monotonic() - last_status >= self.status_interval_seconds:
                    last_status = time.monotonic()
                    for name in live:
                        self.nodes.post_status(name)
                with self._lock:
                    runs = [r for r in self._runs.values() if not r.abandoned and r.tokens]
                self.inputs.refresh_tokens(runs)
                self._poll_control()
            except Exception:  # keep heartbeating through transient API errors
                log.exception("heartbeat")

    def _poll_control(self) -> None:
        for request in self.control_dir.glob(f"{KILL_NODE_REQUEST}*"):
            request.unlink(missing_ok=True)
            self.kill_node(request.name.removeprefix(KILL_NODE_REQUEST))

    def _hosts_loop(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self._refresh_hosts()
            except Exception:
                log.exception("hosts refresh")

    def _refresh_hosts(self) -> None:
        services = self.request("GET", "/api/v1/services")["items"]
        pods = self.request("GET", "/api/v1/pods")["items"]
        text = hosts_text(Path("/etc/hosts").read_text(), services, pods)
        with self._lock:
            rewrite_in_place(self.hosts_file, text)

    # --- pods -----------------------------------------------------------------------------------------
    def _pod_loop(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.request("GET", "/api/v1/pods")
                present = set()
                for pod in listing["items"]:
                    present.add(pod["metadata"]["uid"])
                    self._sync(pod, deleted=False)
                with self._lock:
                    gone = [r for uid, r in self._runs.items() if uid not in present]
                for run in gone:  # deleted while we were not watching
                    self._forget(run)
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=30,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    if event["type"] == "ERROR":
                        break  # e.g. 410 Gone: relist
                    self._sync(event["raw_object"], deleted=event["type"] == "DELETED")
            except Exception:
                if not self._stop.is_set():
                    log.exception("pod watch; relisting")
                    self._stop.wait(1.0)

    def _sync(self, pod: dict[str, Any], deleted: bool) -> None:
        node = dig(pod, "spec", "nodeName")
        if node not in self.node_names or node in self._dead:
            return
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            run = self._runs.get(uid)
            if deleted:
                if run is not None:
                    self._forget(run)
                return
            phase = dig(pod, "status", "phase")
            if meta.get("deletionTimestamp"):
                if run is not None:
                    run.grace_seconds = float(meta.get("deletionGracePeriodSeconds") or 0)
                    if not run.stop_requested.is_set():
                        run.stop_requested.set()
                        threading.Thread(target=self._terminate, args=(run,), daemon=True).start()
                else:
                    self._delete_now(meta["namespace"], meta["name"], uid)
                return
            if run is not None or phase in ("Succeeded", "Failed"):
                return
            pod_dir = self.run_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{uid[:8]}"
            run = PodRun(uid=uid, namespace=meta["namespace"], name=meta["name"], node=node, pod_dir=pod_dir)
            self._runs[uid] = run
        if phase == "Running":  # running before this agent started: its processes are gone
            self.status.terminated(run, pod, 137, "ContainerLost", "the local node agent restarted")
            return
        threading.Thread(
            target=self._run_pod, args=(run, pod), name=f"pod-{meta['name']}", daemon=True
        ).start()

    def _forget(self, run: PodRun) -> None:
        run.abandoned = True
        self._kill_all(run)
        with self._lock:
            self._runs.pop(run.uid, None)

    def _delete_now(self, namespace: str, name: str, uid: str) -> None:
        try:
            body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("delete pod %s/%s: %s", namespace, name, e.reason)

    def _terminate(self, run: PodRun) -> None:
        """Graceful stop: SIGTERM to the main process, SIGKILL to the whole pod after the grace."""
        proc = run.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(run.grace_seconds, 0.0))
        self._kill_all(run)
        with self._lock:
            done = run.done
        if done:  # already terminated before the deletion: nothing to report, just delete
            self._finish_deletion(run)
        # else _run_pod sees stop_requested, reports, then deletes the pod.

    def _finish_deletion(self, run: PodRun) -> None:
        self._delete_now(run.namespace, run.name, run.uid)
        with self._lock:
            self._runs.pop(run.uid, None)

    def _kill_all(self, run: PodRun) -> None:
        """SIGKILL every process of the pod. The pod's mount namespace is forgotten afterwards: once
        its processes are gone the kernel may give its inode number to a new pod's namespace."""
        with self._lock:
            ns, run.mnt_ns = run.mnt_ns, None
        pids = pids_in_namespace(ns) if ns else []
        if run.proc is not None and run.proc.poll() is None:
            pids.append(run.proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _run_pod(self, run: PodRun, pod: dict[str, Any]) -> None:
        waiting_reported = False
        plan: ProcessPlan | None = None
        while plan is None:
            try:
                plan = self._prepare(run, pod)
            except MissingReference as e:  # as kubelet: wait (ContainerCreating) and retry
                if not waiting_reported:
                    waiting_reported = True
                    self.status.waiting(run, pod, "CreateContainerConfigError", str(e))
                if run.stop_requested.is_set() or run.abandoned or self._stop.wait(1.0):
                    break
            except PodSpecError as e:
                log.warning("pod %s/%s cannot run locally: %s", run.namespace, run.name, e)
                self._report_start_error(run, pod, str(e))
                return
            except Exception as e:
                log.exception("prepare pod %s/%s", run.namespace, run.name)
                self._report_start_error(run, pod, f"local node agent: {e}")
                return
        policy = dig(pod, "spec", "restartPolicy") or "Always"
        while plan is not None and not run.stop_requested.is_set() and not run.abandoned:
            started = now()
            with run.log_path.open("ab") as out:
                run.proc = subprocess.Popen(
                    launcher_argv(plan), env=plan.env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
                )  # fmt: skip
            run.mnt_ns = await_pod_namespace(run.proc)
            (run.pod_dir / "pid").write_text(f"{run.proc.pid} {run.mnt_ns}\n")
            self.status.running(run, pod, started)
            rc = run.proc.wait()
            self._kill_all(run)  # what the main process left behind dies with the container
            exit_code = rc if rc >= 0 else 128 - rc
            if run.abandoned:
                return
            restart = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
            if run.stop_requested.is_set() or not restart:
                break
            run.restart_count += 1
            self._stop.wait(1.0)  # a short, fixed back-off (kubelet's starts at 10 s)
        else:
            exit_code, started = 137, now()  # stopped before (re)starting
        if run.abandoned:
            return
        reason = "Completed" if exit_code == 0 else "Error"
        self.status.terminated(run, pod, exit_code, reason, "", started=started)
        with self._lock:
            run.done = True
        if run.stop_requested.is_set():
            self._finish_deletion(run)

    def _report_start_error(self, run: PodRun, pod: dict[str, Any], message: str) -> None:
        self.status.terminated(run, pod, 128, "StartError", message)
        with self._lock:
            run.done = True
        if run.stop_requested.is_set():
            self._finish_deletion(run)

    def _prepare(self, run: PodRun, pod: dict[str, Any]) -> ProcessPlan:
        """The pod's process plan, its inputs fetched and laid out on the host first."""
        run.pod_dir.mkdir(parents=True, exist_ok=True)
        tmp = run.pod_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        tmp.chmod(0o1777)
        self._refresh_hosts()
        container = (dig(pod, "spec", "containers") or [{}])[0]
        config_maps, secrets = self.inputs.env_sources(run.namespace, container)
        node = self.request("GET", f"/api/v1/nodes/{run.node}")
        ctx = PlanContext(
            venv_bin=self.venv_bin,
            apiserver_host=self.apiserver_host,
            apiserver_port=self.apiserver_port,
            hosts_file=str(self.hosts_file),
            tmp_dir=str(tmp),
            volumes=self.inputs.volumes(run, pod),
            config_maps=config_maps,
            secrets=secrets,
            node_allocatable=dig(node, "status", "allocatable") or dict(P5_RESOURCES),
        )
        plan = plan_pod(pod, ctx)
        with self._lock:
            self._created_host_dirs.update(host_mount_points(plan, os.path.lexists))
        return plan
