"""A kubelet + container runtime stand-in, for LOCAL USE ONLY (tests and `make demo-agent`).

It is not a kubelet, isolates nothing that matters for security, and must never be pointed at a real
cluster. It registers Nodes shaped like EKS p5.48xlarge (full p5 capacity is advertised; the local
CPU demo requests no GPUs), keeps them Ready (node Lease in kube-node-lease + status conditions), and
runs every pod bound to one of them as a local process group:

- each pod in its own mount namespace (`unshare --mount`): private /tmp, a 64 MiB tmpfs /dev/shm
  (containerd's default) unless a memory volume is mounted there, every volume bind-mounted at its
  mountPath (emptyDir -> a per-pod directory; a PVC -> one directory per claim's volume, shared by all
  local nodes; ConfigMap/Secret/downward-API/projected -> files, the ServiceAccount token from the
  TokenRequest API bound to the pod), an /etc/hosts naming every Service `<svc>.<ns>.svc[.cluster.local]`
  at 127.0.0.1;
- host network: pod IP = host IP = 127.0.0.1, KUBERNETES_SERVICE_HOST/PORT = the local apiserver;
- no images: the project's virtualenv is first on PATH (see rtj_local.podrun);
- status through pods/status (Running with containerStatuses, then Terminated with the exit code,
  phase Succeeded/Failed for restartPolicy Never); on deletion SIGTERM to the container's main
  process, SIGKILL to everything in the pod after the grace period, then delete with grace 0.
- `kill_node(name)` simulates a node's death: SIGKILL everything on it and stop renewing its Lease
  and status, so the real node-lifecycle controller marks it NotReady/Unknown and taints it.

All processes of a pod share its mount namespace; that, not the process group, is how "everything in
the pod" is found (torch elastic starts its workers in new sessions).

The agent authenticates with the admin kubeconfig: a real kubelet has a node identity confined by
the Node authorizer; this stand-in does not need one.

CLI: `python -m rtj_local.node_agent run --kubeconfig K --run-dir D --nodes 3` and
`python -m rtj_local.node_agent kill-node --run-dir D NODE`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from rtj.contract import kube_time, micro_time

from rtj_local.nodes import P5_RESOURCES, p5_node
from rtj_local.podrun import (
    HOST_IP,
    POD_IP,
    MissingReference,
    PlanContext,
    PodSpecError,
    ProcessPlan,
    VolumeSource,
    field_ref_value,
    host_mount_points,
    launcher_argv,
    plan_pod,
)
from rtj_local.procs import ProcInfo, read_process
from rtj_local.rawapi import MERGE, SMP, RawApi

log = logging.getLogger("rtj_local.node_agent")

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENT_LABEL = "rtj.local/agent"
AGENT_ANNOTATION = "rtj.local/node-agent"
DEFAULT_PREFIX = "local-p5-"
DEFAULT_NODE_NAMES = tuple(f"{DEFAULT_PREFIX}{i}" for i in range(3))
KUBELET_VERSION = "v1.37.2-rtj-local"


def _now() -> str:
    return kube_time(datetime.now(UTC))


def _get(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _pids_in_ns(ns: str) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _mnt_ns(int(entry.name)) == ns:
            pids.append(int(entry.name))
    return pids


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.replace(path)


@dataclass
class _Token:
    path: Path
    service_account: str
    audience: str | None
    expiration_seconds: int
    refresh_at: float  # time.time()


@dataclass
class _PodRun:
    uid: str
    namespace: str
    name: str
    node: str
    pod_dir: Path
    proc: subprocess.Popen[bytes] | None = None
    mnt_ns: str | None = None
    restart_count: int = 0
    stop_requested: threading.Event = field(default_factory=threading.Event)
    grace_seconds: float = 30.0
    #: The node died (or the agent stopped): report nothing more, as a dead kubelet would.
    abandoned: bool = False
    #: The runner thread has reported the final status (a later deletion just deletes).
    done: bool = False
    tokens: list[_Token] = field(default_factory=list)

    @property
    def log_path(self) -> Path:
        return self.pod_dir / "container.log"


class NodeAgent:
    """Runs pods bound to `node_names` as local processes. LOCAL USE ONLY; see the module docstring."""

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
        self.lease_duration_seconds = lease_duration_seconds
        self.renew_interval_seconds = renew_interval_seconds
        self.status_interval_seconds = status_interval_seconds
        self.delete_nodes_on_stop = delete_nodes_on_stop
        self.hosts_file = self.run_dir / "hosts"
        self.control_dir = self.run_dir / "control"
        self._lock = threading.RLock()
        self._runs: dict[str, _PodRun] = {}
        self._dead: set[str] = set()
        self._node_uids: dict[str, str] = {}
        self._created_host_dirs: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._api = config.new_client_from_config(config_file=str(self.kubeconfig))
        self._api.configuration.connection_pool_maxsize = 32
        self.core = client.CoreV1Api(self._api)  # for the pod watch
        self.request = RawApi(self._api).request
        server = urlparse(self._api.configuration.host)
        self.apiserver_host = server.hostname or "127.0.0.1"
        self.apiserver_port = server.port or 443
        self._ca_pem = self._read_ca()

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> NodeAgent:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.control_dir.mkdir(exist_ok=True)
        self._refresh_hosts()
        for name in self.node_names:
            self._register(name)
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
                try:
                    self.request("DELETE", f"/api/v1/nodes/{name}")
                except ApiException as e:
                    if e.status != 404:
                        log.warning("delete node %s: %s", name, e.reason)
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
        return [p for p in map(read_process, _pids_in_ns(run.mnt_ns)) if p is not None]

    def pvc_dir(self, namespace: str, claim: str) -> Path:
        """The local directory backing a PVC (as mounted into pods)."""
        return Path(self._pvc_source(namespace, claim))

    # --- nodes ----------------------------------------------------------------------------------------
    def _read_ca(self) -> bytes:
        cfg = self._api.configuration
        if cfg.ssl_ca_cert:
            return Path(cfg.ssl_ca_cert).read_bytes()
        return b""

    def _node_manifest(self, name: str) -> dict[str, Any]:
        node = p5_node(
            name,
            annotations={AGENT_ANNOTATION: "true"},  # not KWOK's: KWOK must leave these nodes alone
            labels={AGENT_LABEL: "true"},
        )
        node["status"].update(self._node_status(name, transition=_now()))
        return node

    def _node_status(self, name: str, transition: str) -> dict[str, Any]:
        now = _now()

        def cond(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition,
            }

        return {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "local node agent"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "local node agent"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "local node agent"),
                cond("Ready", "True", "KubeletReady", "local node agent is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": HOST_IP}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": os.uname().release,
                "osImage": "rtj local node agent",
                "containerRuntimeVersion": "rtj-local://0",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self, name: str) -> None:
        manifest = self._node_manifest(name)
        try:
            uid = self.request("POST", "/api/v1/nodes", manifest)["metadata"]["uid"]
        except ApiException as e:
            if e.status != 409:
                raise
            patch = {"metadata": manifest["metadata"], "spec": manifest["spec"]}
            uid = self.request("PATCH", f"/api/v1/nodes/{name}", patch, SMP)["metadata"]["uid"]
        self._node_uids[name] = uid
        # The status given on create may be dropped: set it through the status subresource too.
        self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": manifest["status"]}, SMP)
        self._renew_lease(name)

    def _renew_lease(self, name: str) -> None:
        body = {
            "metadata": {
                "name": name,
                "namespace": "kube-node-lease",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": self._node_uids[name]}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": self.lease_duration_seconds,
                "renewTime": micro_time(datetime.now(UTC)),
            },
        }
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        try:
            self.request("PATCH", f"{path}/{name}", body, MERGE)
        except ApiException as e:
            if e.status != 404:
                raise
            self.request("POST", path, body)

    def _heartbeat_loop(self) -> None:
        last_status = 0.0
        while not self._stop.wait(self.renew_interval_seconds):
            live = [n for n in self.node_names if n not in self._dead]
            try:
                for name in live:
                    self._renew_lease(name)
                if time.monotonic() - last_status >= self.status_interval_seconds:
                    last_status = time.monotonic()
                    for name in live:
                        self._post_node_status(name)
                self._refresh_tokens()
                self._poll_control()
            except Exception:  # keep heartbeating through transient API errors
                log.exception("heartbeat")

    def _post_node_status(self, name: str) -> None:
        node = self.request("GET", f"/api/v1/nodes/{name}/status")
        conditions = _get(node, "status", "conditions") or []
        ready: dict[str, Any] = next((c for c in conditions if c["type"] == "Ready"), {})
        transition = ready.get("lastTransitionTime") if ready.get("status") == "True" else None
        status = self._node_status(name, transition or _now())
        self.request(
            "PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": status["conditions"]}}, SMP
        )

    def _poll_control(self) -> None:
        for request in self.control_dir.glob("kill-node-*"):
            request.unlink(missing_ok=True)
            self.kill_node(request.name.removeprefix("kill-node-"))

    # --- /etc/hosts -------------------------------------------------------------------------------------
    def _hosts_loop(self) -> None:
        while not self._stop.wait(2.0):
            try:
                self._refresh_hosts()
            except Exception:
                log.exception("hosts refresh")

    def _refresh_hosts(self) -> None:
        names: list[str] = []
        for svc in self.request("GET", "/api/v1/services")["items"]:
            n, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
            names += [f"{n}.{ns}.svc", f"{n}.{ns}.svc.cluster.local", f"{n}.{ns}"]
        for pod in self.request("GET", "/api/v1/pods")["items"]:
            host, sub = _get(pod, "spec", "hostname"), _get(pod, "spec", "subdomain")
            if host and sub:
                ns = pod["metadata"]["namespace"]
                names += [f"{host}.{sub}.{ns}.svc", f"{host}.{sub}.{ns}.svc.cluster.local"]
        base = Path("/etc/hosts").read_text()
        text = base.rstrip("\n") + "\n# Services and pods of the local cluster (rtj local node agent)\n"
        text += "".join(f"{POD_IP} {name}\n" for name in sorted(set(names)))
        # Rewritten in place: the file is bind-mounted into running pods, a rename would not reach them.
        with self._lock:
            if not self.hosts_file.exists() or self.hosts_file.read_text() != text:
                with open(self.hosts_file, "a+") as f:
                    f.seek(0)
                    f.truncate()
                    f.write(text)

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
        node = _get(pod, "spec", "nodeName")
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
            phase = _get(pod, "status", "phase")
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
            run = _PodRun(uid=uid, namespace=meta["namespace"], name=meta["name"], node=node, pod_dir=pod_dir)
            self._runs[uid] = run
        if phase == "Running":  # running before this agent started: its processes are gone
            self._report_terminated(run, pod, 137, "ContainerLost", "the local node agent restarted")
            return
        threading.Thread(
            target=self._run_pod, args=(run, pod), name=f"pod-{meta['name']}", daemon=True
        ).start()

    def _forget(self, run: _PodRun) -> None:
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

    def _terminate(self, run: _PodRun) -> None:
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

    def _finish_deletion(self, run: _PodRun) -> None:
        self._delete_now(run.namespace, run.name, run.uid)
        with self._lock:
            self._runs.pop(run.uid, None)

    def _kill_all(self, run: _PodRun) -> None:
        """SIGKILL every process of the pod. The pod's mount namespace is forgotten afterwards: once
        its processes are gone the kernel may give its inode number to a new pod's namespace."""
        with self._lock:
            ns, run.mnt_ns = run.mnt_ns, None
        pids = _pids_in_ns(ns) if ns else []
        if run.proc is not None and run.proc.poll() is None:
            pids.append(run.proc.pid)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _run_pod(self, run: _PodRun, pod: dict[str, Any]) -> None:
        waiting_reported = False
        plan: ProcessPlan | None = None
        while plan is None:
            try:
                plan = self._prepare(run, pod)
            except MissingReference as e:  # as kubelet: wait (ContainerCreating) and retry
                if not waiting_reported:
                    waiting_reported = True
                    self._report_waiting(run, pod, "CreateContainerConfigError", str(e))
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
        policy = _get(pod, "spec", "restartPolicy") or "Always"
        while plan is not None and not run.stop_requested.is_set() and not run.abandoned:
            started = _now()
            with run.log_path.open("ab") as out:
                run.proc = subprocess.Popen(
                    launcher_argv(plan), env=plan.env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
                )  # fmt: skip
            run.mnt_ns = self._await_ns(run.proc)
            (run.pod_dir / "pid").write_text(f"{run.proc.pid} {run.mnt_ns}\n")
            self._report_running(run, pod, plan, started)
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
            exit_code, started = 137, _now()  # stopped before (re)starting
        if run.abandoned:
            return
        reason = "Completed" if exit_code == 0 else "Error"
        self._report_terminated(run, pod, exit_code, reason, "", started=started)
        with self._lock:
            run.done = True
        if run.stop_requested.is_set():
            self._finish_deletion(run)

    def _report_start_error(self, run: _PodRun, pod: dict[str, Any], message: str) -> None:
        self._report_terminated(run, pod, 128, "StartError", message)
        with self._lock:
            run.done = True
        if run.stop_requested.is_set():
            self._finish_deletion(run)

    @staticmethod
    def _await_ns(proc: subprocess.Popen[bytes]) -> str | None:
        """The pod's mount namespace, once the launcher has set it up and exec'd the command (or
        None if it exited first)."""
        own = _mnt_ns(os.getpid())
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and proc.poll() is None:
            ns = _mnt_ns(proc.pid)
            try:
                cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                cmdline = []
            launching = cmdline[:1] == [b"unshare"] or cmdline[3:4] == [b"rtj-pod"]
            if ns is not None and ns != own and not launching:
                return ns
            time.sleep(0.005)
        return _mnt_ns(proc.pid) if proc.poll() is None else None

    # --- plan inputs ------------------------------------------------------------------------------------
    def _prepare(self, run: _PodRun, pod: dict[str, Any]) -> ProcessPlan:
        run.pod_dir.mkdir(parents=True, exist_ok=True)
        tmp = run.pod_dir / "tmp"
        tmp.mkdir(exist_ok=True)
        tmp.chmod(0o1777)
        self._refresh_hosts()
        ns = run.namespace
        container = (_get(pod, "spec", "containers") or [{}])[0]
        config_maps: dict[str, dict[str, str]] = {}
        secrets: dict[str, dict[str, str]] = {}
        for name in _referenced(container, "configMap"):
            data = self._config_map(ns, name)
            if data is not None:
                config_maps[name] = data
        for name in _referenced(container, "secret"):
            data = self._secret(ns, name)
            if data is not None:
                secrets[name] = data
        node = self.request("GET", f"/api/v1/nodes/{run.node}")
        ctx = PlanContext(
            venv_bin=self.venv_bin,
            apiserver_host=self.apiserver_host,
            apiserver_port=self.apiserver_port,
            hosts_file=str(self.hosts_file),
            tmp_dir=str(tmp),
            volumes=self._prepare_volumes(run, pod),
            config_maps=config_maps,
            secrets=secrets,
            node_allocatable=_get(node, "status", "allocatable") or dict(P5_RESOURCES),
        )
        plan = plan_pod(pod, ctx)
        with self._lock:
            self._created_host_dirs.update(host_mount_points(plan, os.path.lexists))
        return plan

    def _config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return self.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/{name}").get("data") or {}
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            data = self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}").get("data") or {}
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _pvc_source(self, namespace: str, claim: str) -> str:
        """One directory per volume the claim is bound to (for a CSI volume, per volumeHandle, so
        claims of one file system share it); shared by every node of this agent."""
        pvc = self.request("GET", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
        pv_name = _get(pvc, "spec", "volumeName")
        key = f"claims/{namespace}/{claim}"
        if pv_name:
            pv = self.request("GET", f"/api/v1/persistentvolumes/{pv_name}")
            csi = _get(pv, "spec", "csi")
            if csi:
                key = f"csi/{csi['driver']}/{csi['volumeHandle']}"
            elif _get(pv, "spec", "hostPath", "path"):
                host_path = _get(pv, "spec", "hostPath")
                if host_path.get("type") == "DirectoryOrCreate":
                    Path(host_path["path"]).mkdir(parents=True, exist_ok=True)
                return str(host_path["path"])
            else:
                key = f"pv/{pv_name}"
        path = self.run_dir / "volumes" / key
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def _prepare_volumes(self, run: _PodRun, pod: dict[str, Any]) -> dict[str, VolumeSource]:
        out: dict[str, VolumeSource] = {}
        fs_group = _get(pod, "spec", "securityContext", "fsGroup")
        for vol in _get(pod, "spec", "volumes") or []:
            name = vol["name"]
            vol_dir = run.pod_dir / "volumes" / name
            if "emptyDir" in vol:
                empty = vol["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    out[name] = VolumeSource(tmpfs_size=empty.get("sizeLimit"))
                    continue
                vol_dir.mkdir(parents=True, exist_ok=True)
                vol_dir.chmod(0o777)  # as kubelet creates emptyDirs
                out[name] = VolumeSource(path=str(vol_dir))
            elif "persistentVolumeClaim" in vol:
                path = self._pvc_source(run.namespace, vol["persistentVolumeClaim"]["claimName"])
                if fs_group is not None:
                    _apply_fs_group(Path(path), int(fs_group))
                out[name] = VolumeSource(path=path)
            elif "hostPath" in vol:
                path = vol["hostPath"]["path"]
                if vol["hostPath"].get("type") == "DirectoryOrCreate":
                    Path(path).mkdir(parents=True, exist_ok=True)
                out[name] = VolumeSource(path=path)
            elif any(k in vol for k in ("configMap", "secret", "downwardAPI", "projected")):
                self._write_files(run, pod, vol, vol_dir)
                out[name] = VolumeSource(path=str(vol_dir))
            else:
                kinds = sorted(set(vol) - {"name"})
                raise PodSpecError(f"volume {name!r}: type {kinds} is not supported by the local node agent")
        return out

    def _write_files(self, run: _PodRun, pod: dict[str, Any], vol: dict[str, Any], vol_dir: Path) -> None:
        vol_dir.mkdir(parents=True, exist_ok=True)
        sources = _get(vol, "projected", "sources") or [vol]
        for src in sources:
            if "serviceAccountToken" in src:
                sat = src["serviceAccountToken"]
                token = _Token(
                    path=vol_dir / sat.get("path", "token"),
                    service_account=_get(pod, "spec", "serviceAccountName") or "default",
                    audience=sat.get("audience"),
                    expiration_seconds=int(sat.get("expirationSeconds") or 3607),
                    refresh_at=0.0,
                )
                self._issue_token(run, token)
                run.tokens.append(token)
            for kind, fetch in (("configMap", self._config_map), ("secret", self._secret)):
                if kind not in src:
                    continue
                ref = src[kind]
                data = fetch(run.namespace, ref.get("name") or ref.get("secretName", ""))
                if data is None:
                    if ref.get("optional"):
                        continue
                    raise MissingReference(f"{kind} {ref.get('name') or ref.get('secretName')!r} not found")
                items = ref.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] in data:
                        _write_atomic(vol_dir / item["path"], data[item["key"]].encode())
            if "downwardAPI" in src:
                for item in src["downwardAPI"].get("items") or []:
                    if "fieldRef" not in item:
                        raise PodSpecError(
                            f"downwardAPI item {item.get('path')!r}: only fieldRef is supported"
                        )
                    _write_atomic(
                        vol_dir / item["path"], field_ref_value(pod, item["fieldRef"]["fieldPath"]).encode()
                    )

    def _issue_token(self, run: _PodRun, token: _Token) -> None:
        spec: dict[str, Any] = {
            "expirationSeconds": token.expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": run.name, "uid": run.uid},
        }
        if token.audience:
            spec["audiences"] = [token.audience]
        resp = self.request(
            "POST",
            f"/api/v1/namespaces/{run.namespace}/serviceaccounts/{token.service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        expires = datetime.fromisoformat(resp["status"]["expirationTimestamp"].replace("Z", "+00:00"))
        now = time.time()
        token.refresh_at = now + 0.8 * (expires.timestamp() - now)  # kubelet refreshes at 80% of the TTL
        _write_atomic(token.path, resp["status"]["token"].encode(), 0o644)

    def _refresh_tokens(self) -> None:
        with self._lock:
            runs = [r for r in self._runs.values() if not r.abandoned and r.tokens]
        for run in runs:
            for token in run.tokens:
                if time.time() >= token.refresh_at:
                    self._issue_token(run, token)

    # --- status -----------------------------------------------------------------------------------------
    def _patch_status(self, run: _PodRun, status: dict[str, Any]) -> None:
        try:
            self.request(
                "PATCH", f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status", {"status": status}, SMP
            )
        except ApiException as e:
            if e.status != 404:  # a pod deleted meanwhile needs no status
                log.warning("status of %s/%s: %s %s", run.namespace, run.name, e.status, e.body)

    @staticmethod
    def _conditions(ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
        now = _now()
        out = [
            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        ]
        for type_ in ("ContainersReady", "Ready"):
            cond = {"type": type_, "status": "True" if ready else "False", "lastTransitionTime": now}
            if reason:
                cond["reason"] = reason
            out.append(cond)
        return out

    def _container_status(
        self, run: _PodRun, pod: dict[str, Any], state: dict[str, Any], ready: bool
    ) -> dict:
        container = (_get(pod, "spec", "containers") or [{}])[0]
        state = {"waiting": None, "running": None, "terminated": None, **state}
        return {
            "name": container.get("name", "main"),
            "image": container.get("image", ""),
            "imageID": "",
            "containerID": f"rtj-local://{run.uid}-{run.restart_count}",
            "ready": ready,
            "started": ready,
            "restartCount": run.restart_count,
            "state": state,
        }

    def _report_waiting(self, run: _PodRun, pod: dict[str, Any], reason: str, message: str) -> None:
        waiting = {"waiting": {"reason": reason, "message": message}}
        self._patch_status(run, {"containerStatuses": [self._container_status(run, pod, waiting, False)]})

    def _report_running(self, run: _PodRun, pod: dict[str, Any], plan: ProcessPlan, started: str) -> None:
        status = {
            "phase": "Running",
            "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}],
            "hostIP": HOST_IP,
            "hostIPs": [{"ip": HOST_IP}],
            "startTime": _get(pod, "status", "startTime") or started,
            "conditions": self._conditions(ready=True),
            "containerStatuses": [
                self._container_status(run, pod, {"running": {"startedAt": started}}, True)
            ],
        }
        self._patch_status(run, status)
        log.info("pod %s/%s running on %s (pid %s, log %s)", run.namespace, run.name, run.node,
                 run.proc.pid if run.proc else None, run.log_path)  # fmt: skip

    def _report_terminated(
        self,
        run: _PodRun,
        pod: dict[str, Any],
        exit_code: int,
        reason: str,
        message: str,
        started: str | None = None,
    ) -> None:
        terminated = {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": started or _now(),
            "finishedAt": _now(),
            "containerID": f"rtj-local://{run.uid}-{run.restart_count}",
        }
        if message:
            terminated["message"] = message
        policy = _get(pod, "spec", "restartPolicy") or "Always"
        status: dict[str, Any] = {
            "conditions": self._conditions(ready=False, reason="PodCompleted"),
            "containerStatuses": [self._container_status(run, pod, {"terminated": terminated}, False)],
        }
        if policy == "Never" or (policy == "OnFailure" and exit_code == 0) or reason == "StartError":
            status["phase"] = "Succeeded" if exit_code == 0 else "Failed"
        if reason == "StartError" and message:
            status["message"] = message
            status["reason"] = "StartError"
        self._patch_status(run, status)
        log.info("pod %s/%s terminated: exit %s (%s)", run.namespace, run.name, exit_code, reason)


def _referenced(container: dict[str, Any], kind: str) -> set[str]:
    """Names of ConfigMaps (kind="configMap") or Secrets (kind="secret") the container's env uses."""
    names = set()
    for src in container.get("envFrom") or []:
        ref = src.get(f"{kind}Ref")
        if ref:
            names.add(ref.get("name", ""))
    for var in container.get("env") or []:
        ref = _get(var, "valueFrom", f"{kind}KeyRef")
        if ref:
            names.add(ref.get("name", ""))
    return names


def _apply_fs_group(path: Path, gid: int) -> None:
    """What kubelet does for fsGroup on a volume: group ownership and group write, setgid dirs."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            st = os.lstat(name)
            os.lchown(name, -1, gid)
            if os.path.isdir(name):
                os.chmod(name, st.st_mode | 0o2070)
            else:
                os.chmod(name, st.st_mode | 0o060)


def request_kill_node(run_dir: Path, node: str) -> None:
    """Asks the agent running with `run_dir` (another process) to kill `node`."""
    (Path(run_dir) / "control" / f"kill-node-{node}").touch()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m rtj_local.node_agent", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="register nodes and run their pods until SIGTERM/SIGINT")
    run.add_argument("--kubeconfig", required=True, type=Path)
    run.add_argument("--run-dir", required=True, type=Path)
    run.add_argument("--nodes", type=int, default=3)
    run.add_argument("--prefix", default=DEFAULT_PREFIX)
    kill = sub.add_parser("kill-node", help="simulate the death of a node of a running agent")
    kill.add_argument("--run-dir", required=True, type=Path)
    kill.add_argument("node")
    args = parser.parse_args(argv)
    if args.command == "kill-node":
        request_kill_node(args.run_dir, args.node)
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = NodeAgent(args.kubeconfig, args.run_dir, [f"{args.prefix}{i}" for i in range(args.nodes)])
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    agent.start()
    done.wait()
    agent.stop()
    shutil.rmtree(args.run_dir / "control", ignore_errors=True)


if __name__ == "__main__":
    main()
