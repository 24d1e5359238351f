"""The operator at scale on the local cluster: jobs x 8 pods on KWOK p5.48xlarge nodes, heartbeats live.

For each size (jobs, ramped in one cluster: 10 -> 100 -> ...) it measures
- create -> all pods created: per job, from the POST of the job to the last of its 9 pods (8
  workers + rendezvous) seen on a pod watch (p50/p99; watch delivery included, so an upper bound);
- heartbeat deadline -> replacement pod: K pods (one per job) stop renewing their Lease; from
  last renewTime + heartbeatTimeoutSeconds to the replacement pod (same slot, next attempt) seen
  on the watch, split into deadline -> old pod deleted (operator) and deleted -> replacement seen;
- CPU (cores) and RSS of the operator process, apiserver, etcd, KWOK, scheduler, controller-manager
  and this process (the load generator), from /proc, over a steady window with heartbeats running;
- API requests/s made by the operator, counted by the apiserver: the operator runs as a
  ServiceAccount outside kube-system, the only client of APF flow schema `service-accounts`
  (apiserver_flowcontrol_dispatched_requests_total); everything else here is system:masters or a
  kube-system component;
- the operator's passes/s (its rtj_reconcile_duration_seconds_count) in the steady window, and
  the flapping Events posted in it with no fault injected: every Event on a job (there is nothing
  to report) and every NodeNotReady (KWOK's node Leases missing their grace).

Heartbeat period: `--heartbeat-interval 0` (the default) picks it from the Lease write budget
(`--lease-budget`, renewals/s this control plane can take next to everything else), as
docs/benchmarks.md explains: period = max(10 s, pods / budget), timeout = 3 periods.

The load generator is this process: one aiohttp session (keep-alive) renewing every Running worker
pod's Lease every --heartbeat-interval seconds with the body the trainer's heartbeat agent writes
(rtj.contract labels, annotation and Heartbeat JSON; strategic merge patch, POST on 404), phases
spread evenly. Its CPU is reported in its own column, never charged to the operator.

Jobs use gpusPerNode=1, so 8 pods of a job share no node (the operator's anti-affinity) while 8
jobs share a node: N jobs need N nodes (1,000 jobs x 8 pods = 8,000 pods on 1,000 p5 nodes).

    .venv/bin/python bench/operator_scale.py --jobs 50                 # quick (make bench)
    .venv/bin/python bench/operator_scale.py --sizes 10,100,300,1000   # the big run (manual)
    flock /tmp/rtj-heavy.lock .venv/bin/python bench/operator_scale.py --jobs 1000 --steady 120
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import math
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from rtj import contract
from rtj.contract import micro_time
from rtj_local.cluster import LocalCluster
from rtj_local.components import ClusterOptions
from rtj_local.kubeconfig import build_kubeconfig, write_kubeconfig
from rtj_local.nodes import p5_node
from rtj_local.procs import free_port

ROOT = Path(__file__).resolve().parent.parent
NS, OP_NS, OP_SA = "rtj-scale", "rtj-system", "rtj-operator"
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
NODEGROUP = "p5-scale"
WORKERS_PER_JOB = 8
OP_FLOW_SCHEMA = "service-accounts"
CLK_TCK = os.sysconf("SC_CLK_TCK")
JOBS_PATH = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}"
LEASES_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


# --- /proc sampling ----------------------------------------------------------------------------------
def proc_cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def proc_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class CpuWindow:
    pids: dict[str, int]
    t0: float = 0.0
    cpu0: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.cpu0 = {k: proc_cpu_seconds(p) or 0.0 for k, p in self.pids.items()}
        self.peak_rss = {}

    def sample_rss(self) -> None:
        for k, p in self.pids.items():
            rss = proc_rss_mb(p) or 0.0
            self.peak_rss[k] = max(self.peak_rss.get(k, 0.0), rss)

    def cores(self) -> dict[str, float]:
        dt = time.monotonic() - self.t0
        return {k: ((proc_cpu_seconds(p) or 0.0) - self.cpu0[k]) / dt for k, p in self.pids.items()}


# --- the apiserver's own count of requests --------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:]+)\{([^}]*)\} ([0-9.e+-]+)$")


def parse_counters(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out.append((labels, float(m.group(3))))
    return out


@dataclass
class ApiCounts:
    operator: float  # requests dispatched for the operator's flow schema
    total: float  # all requests the apiserver served
    by_verb: dict[str, float]  # operator-only resources: verb/resource -> count (all clients)


def api_counts(text: str) -> ApiCounts:
    if not text:  # no /metrics answer: rates come out as nan, not as wrong numbers
        return ApiCounts(float("nan"), float("nan"), {})
    op = sum(
        v
        for labels, v in parse_counters(text, "apiserver_flowcontrol_dispatched_requests_total")
        if labels.get("flow_schema") == OP_FLOW_SCHEMA
    )
    total, by_verb = 0.0, {}
    for labels, v in parse_counters(text, "apiserver_request_total"):
        total += v
        sub = labels.get("subresource")
        key = f"{labels.get('verb')} {labels.get('resource')}{'/' + sub if sub else ''}"
        if not labels.get("code", "200").startswith("2"):
            key += f" {labels.get('code')}"
        by_verb[key] = by_verb.get(key, 0.0) + v
    return ApiCounts(op, total, by_verb)


# --- the bench ------------------------------------------------------------------------------------------
@dataclass
class PodInfo:
    name: str
    uid: str
    job: str
    role: str
    slot: int | None
    attempt: int
    phase: str = "Pending"
    deleting: bool = False
    seen: float = 0.0  # wall clock (time.time) when first seen on the watch


@dataclass
class Fault:
    job: str
    slot: int
    old_pod: str
    old_attempt: int
    stop_at: float  # wall clock: renewals stop
    deadline: float | None = None  # last renewTime + heartbeatTimeoutSeconds
    deleted_seen: float | None = None  # old pod's deletionTimestamp (or DELETED) seen
    replacement_seen: float | None = None


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.run_dir = Path(a.run_dir).resolve()
        self.cluster = LocalCluster(
            self.run_dir,
            # Upstream node-lease/monitor defaults (40 s Lease, 50 s grace) unless --node-lease-seconds:
            # KWOK renews every fake node's Lease every quarter of it, scaffolding load that a real
            # cluster spreads over its kubelets, not on the control plane's cores.
            ClusterOptions(
                node_monitor_grace_period=f"{max(50, a.node_lease_seconds * 5 // 4)}s",
                node_monitor_period="5s",
                node_lease_duration_seconds=a.node_lease_seconds,
            ),
        )
        self.pods: dict[str, PodInfo] = {}
        self.job_post: dict[str, float] = {}  # job -> wall time just before POST
        self.job_all_pods: dict[str, float] = {}  # job -> wall time its 9th pod was seen
        self.job_first_pod: dict[str, float] = {}  # job -> wall time its first pod was seen
        self.silent: set[str] = set()
        self.faults: list[Fault] = []
        self.last_renew: dict[str, datetime] = {}
        self.acquire: dict[str, str] = {}
        self.step = 0
        self.heap: list[tuple[float, str]] = []
        self.scheduled: set[str] = set()
        self.renewals = 0
        self.renew_errors = 0
        self.renew_lag: list[float] = []
        self.jobs_created = 0
        self.nodes_created = 0
        self.stop = asyncio.Event()
        self.op_proc: subprocess.Popen[bytes] | None = None

    # --- plumbing ------------------------------------------------------------------------------------
    async def req(
        self, method: str, path: str, body: Any = None, ctype: str = "application/json"
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        async with self.http.request(
            method, self.server + path, data=data, headers={"Content-Type": ctype}
        ) as r:
            raw = await r.read()
            try:
                return r.status, json.loads(raw) if raw else None
            except ValueError:
                return r.status, raw.decode(errors="replace")

    async def must(self, method: str, path: str, body: Any = None, ok_conflict: bool = True) -> Any:
        status, out = await self.req(method, path, body)
        if status >= 300 and not (ok_conflict and status == 409):
            raise RuntimeError(f"{method} {path}: {status} {out}")
        return out

    async def setup(self) -> None:
        self.cluster.up(nodes=0, fresh=not self.a.reuse_cluster)
        self.server = self.cluster.server
        ctx = ssl.create_default_context(cafile=str(self.cluster.ca_file))
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=self.a.connections, keepalive_timeout=60),
            headers={"Authorization": f"Bearer {self.cluster.admin_token}"},
            timeout=aiohttp.ClientTimeout(total=30),
        )
        crd = yaml.safe_load((ROOT / "crds" / f"{contract.PLURAL}.{contract.API_GROUP}.yaml").read_text())
        await self.must("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for ns in (NS, OP_NS):
            await self.must(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
        for ns, sa in ((OP_NS, OP_SA), (NS, "rtj-trainer")):
            body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}
            for _ in range(50):  # the namespace may still be initialising
                status, _out = await self.req("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body)
                if status in (201, 409):
                    break
                await asyncio.sleep(0.2)
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "rtj-scale-operator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": OP_SA, "namespace": OP_NS}],
        }
        await self.must("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
        tr = await self.must(
            "POST",
            f"/api/v1/namespaces/{OP_NS}/serviceaccounts/{OP_SA}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 86400},
            },
            ok_conflict=False,
        )
        self.op_kubeconfig = write_kubeconfig(
            self.run_dir / "operator.kubeconfig",
            build_kubeconfig(self.server, self.cluster.ca_file.read_bytes(), tr["status"]["token"], OP_SA),
        )
        # One shared RWX checkpoint volume for every job (static PV bound to its claim; nothing mounts).
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "rtj-scale-ckpt"},
            "spec": {
                "capacity": {"storage": "1Ti"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": "/tmp/rtj-scale-ckpt"},
                "claimRef": {"namespace": NS, "name": "scale-ckpt"},
            },
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "scale-ckpt", "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": "rtj-scale-ckpt",
                "resources": {"requests": {"storage": "1Ti"}},
            },
        }
        await self.must("POST", "/api/v1/persistentvolumes", pv)
        await self.must("POST", f"/api/v1/namespaces/{NS}/persistentvolumeclaims", pvc)
        for _ in range(100):  # CRD established
            status, _ = await self.req("GET", JOBS_PATH)
            if status == 200:
                break
            await asyncio.sleep(0.2)

    def start_operator(self) -> int:
        self.health_port, self.metrics_port = free_port(), free_port()
        env = {
            **os.environ,
            "KUBECONFIG": str(self.op_kubeconfig),
            "RTJ_METRICS_PORT": str(self.metrics_port),
            **dict(kv.split("=", 1) for kv in self.a.operator_env),
        }
        if self.a.operator_src:  # e.g. a checkout of the baseline: its `rtj` shadows the installed one
            env["PYTHONPATH"] = os.pathsep.join([self.a.operator_src, env.get("PYTHONPATH", "")])
        log = (self.run_dir / "operator.log").open("ab")
        self.op_proc = subprocess.Popen(
            # The same options as the chart's `kopf run -m rtj.handlers` (python -m rtj passes them on).
            [
                sys.executable,
                "-m",
                "rtj",
                "--all-namespaces",
                f"--liveness=http://127.0.0.1:{self.health_port}/healthz",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self.op_proc.pid

    async def wait_operator(self) -> None:
        deadline = time.monotonic() + 120
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                assert self.op_proc is not None
                if self.op_proc.poll() is not None:
                    raise RuntimeError(
                        f"operator exited {self.op_proc.returncode}; see {self.run_dir}/operator.log"
                    )
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with s.get(f"http://127.0.0.1:{self.health_port}/healthz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.3)
        raise RuntimeError("operator not live after 120 s")

    # --- nodes and jobs -------------------------------------------------------------------------------
    async def ensure_nodes(self, count: int) -> None:
        gate = asyncio.Semaphore(self.a.connections)

        async def one(i: int) -> None:
            async with gate:
                node = p5_node(f"scale-{i}", labels={NODEGROUP_LABEL: NODEGROUP})
                await self.must("POST", "/api/v1/nodes", node)

        await asyncio.gather(*(one(i) for i in range(self.nodes_created, count)))
        self.nodes_created = max(self.nodes_created, count)

    def job_manifest(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
            "kind": contract.KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "image": "rtj-trainer:local",
                "command": ["python", "train.py"],
                "nodes": WORKERS_PER_JOB,
                "gpusPerNode": 1,
                "placement": {"nodeSelector": {NODEGROUP_LABEL: NODEGROUP}},
                "resources": {"cpu": "4", "memory": "16Gi", "efaPerNode": 0},
                "checkpoint": {"pvc": {"claimName": "scale-ckpt"}},
                "faultTolerance": {
                    "heartbeatIntervalSeconds": self.a.heartbeat_interval,
                    "heartbeatTimeoutSeconds": self.a.heartbeat_timeout,
                    "maxPodReschedules": 100,
                },
            },
        }

    async def create_jobs(self, count: int) -> None:
        gate = asyncio.Semaphore(self.a.create_concurrency)

        async def one(i: int) -> None:
            name = f"job-{i:04d}"
            async with gate:
                self.job_post[name] = time.time()
                await self.must("POST", JOBS_PATH, self.job_manifest(name), ok_conflict=False)

        await asyncio.gather(*(one(i) for i in range(self.jobs_created, count)))
        self.jobs_created = max(self.jobs_created, count)

    # --- pod watch ------------------------------------------------------------------------------------
    async def watch_pods(self) -> None:
        sel = f"labelSelector={contract.LABEL_JOB}"
        rv = ""
        while not self.stop.is_set():
            try:
                if not rv:
                    out = await self.must("GET", f"/api/v1/namespaces/{NS}/pods?{sel}", ok_conflict=False)
                    for obj in out["items"]:
                        self.on_pod("ADDED", obj)
                    rv = out["metadata"]["resourceVersion"]
                url = (
                    f"{self.server}/api/v1/namespaces/{NS}/pods?{sel}&watch=1&resourceVersion={rv}"
                    "&allowWatchBookmarks=true&timeoutSeconds=300"
                )
                async with self.http.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=400)) as r:
                    async for line in r.content:
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            rv = ""
                            break
                        rv = ev["object"]["metadata"].get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            self.on_pod(ev["type"], ev["object"])
            except (TimeoutError, aiohttp.ClientError) as exc:
                print(f"  pod watch restarts: {exc!r}", file=sys.stderr)
                await asyncio.sleep(0.5)

    def on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        now = time.time()
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        name = meta["name"]
        info = self.pods.get(name)
        if info is None or info.uid != meta["uid"]:
            slot = labels.get(contract.LABEL_SLOT)
            info = PodInfo(
                name=name,
                uid=meta["uid"],
                job=labels.get(contract.LABEL_JOB, ""),
                role=labels.get(contract.LABEL_ROLE, ""),
                slot=int(slot) if slot is not None and slot.isdigit() else None,
                attempt=int(labels.get(contract.LABEL_ATTEMPT, "0") or 0),
                seen=now,
            )
            self.pods[name] = info
            self.on_new_pod(info, now)
        info.phase = (obj.get("status") or {}).get("phase") or "Pending"
        info.deleting = bool(meta.get("deletionTimestamp")) or kind == "DELETED"
        if info.deleting:
            for f in self.faults:
                if f.old_pod == name and f.deleted_seen is None:
                    f.deleted_seen = now
        if kind == "DELETED":
            self.pods.pop(name, None)
            return
        running = info.role == contract.ROLE_WORKER and info.phase == "Running" and not info.deleting
        if running and name not in self.scheduled and name not in self.silent:
            self.scheduled.add(name)
            # Even phases: the pod's first beat comes at a random point of its interval.
            heapq.heappush(self.heap, (time.monotonic() + random.uniform(0, self.a.heartbeat_interval), name))

    def on_new_pod(self, info: PodInfo, now: float) -> None:
        if info.job in self.job_post:
            self.job_first_pod.setdefault(info.job, now)
        if info.job in self.job_post and info.job not in self.job_all_pods:
            n = sum(1 for p in self.pods.values() if p.job == info.job and p.attempt == 0)
            if n >= WORKERS_PER_JOB + 1:
                self.job_all_pods[info.job] = now
        for f in self.faults:
            if (
                f.job == info.job
                and f.slot == info.slot
                and info.attempt > f.old_attempt
                and f.replacement_seen is None
            ):
                f.replacement_seen = now

    # --- heartbeats (the trainer's agent, through rtj.contract) ----------------------------------------
    def lease_body(self, pod: PodInfo, now: datetime) -> dict[str, Any]:
        now_s = micro_time(now)
        self.acquire.setdefault(pod.name, now_s)
        self.step += 1
        hb = contract.Heartbeat(state=contract.PodState.TRAINING, step=self.step)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": contract.lease_name(pod.name),
                "namespace": NS,
                "labels": {contract.LABEL_JOB: pod.job},
                "annotations": {contract.HEARTBEAT_ANNOTATION: hb.to_annotation()},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
            },
            "spec": {
                "holderIdentity": pod.name,
                "leaseDurationSeconds": self.a.heartbeat_timeout,
                "acquireTime": self.acquire[pod.name],
                "renewTime": now_s,
            },
        }

    async def renew(self, name: str) -> None:
        pod = self.pods.get(name)
        if pod is None or pod.deleting or name in self.silent:
            self.scheduled.discard(name)
            return
        now = datetime.now(UTC)
        body = self.lease_body(pod, now)
        try:
            status, out = await self.req(
                "PATCH",
                f"{LEASES_PATH}/{body['metadata']['name']}",
                body,
                "application/strategic-merge-patch+json",
            )
            if status == 404:
                status, out = await self.req("POST", LEASES_PATH, body)
            if status >= 300:
                raise RuntimeError(f"{status} {str(out)[:200]}")
            self.renewals += 1
            self.last_renew[name] = now
        except Exception as exc:
            self.renew_errors += 1
            if self.renew_errors < 5:
                print(f"  lease {name}: {exc!r}", file=sys.stderr)
        heapq.heappush(self.heap, (time.monotonic() + self.a.heartbeat_interval, name))

    async def heartbeat_loop(self) -> None:
        inflight: set[asyncio.Task[None]] = set()
        gate = asyncio.Semaphore(self.a.connections)

        async def gated(name: str) -> None:
            async with gate:
                await self.renew(name)

        while not self.stop.is_set():
            now = time.monotonic()
            while self.heap and self.heap[0][0] <= now:
                due, name = heapq.heappop(self.heap)
                self.renew_lag.append(now - due)
                t = asyncio.create_task(gated(name))
                inflight.add(t)
                t.add_done_callback(inflight.discard)
            await asyncio.sleep(0.02)

    # --- faults ----------------------------------------------------------------------------------------
    def inject_faults(self, k: int, jobs: int, spread: float) -> None:
        candidates = [
            p
            for p in self.pods.values()
            if p.role == contract.ROLE_WORKER
            and p.phase == "Running"
            and not p.deleting
            and p.name in self.last_renew
            and int(p.job.split("-")[1]) < jobs
            and p.job not in {f.job for f in self.faults}
        ]
        by_job: dict[str, PodInfo] = {}
        for p in random.sample(candidates, len(candidates)):
            by_job.setdefault(p.job, p)
        t0 = time.time()
        for i, p in enumerate(list(by_job.values())[:k]):
            self.faults.append(Fault(p.job, p.slot or 0, p.name, p.attempt, t0 + spread * i / max(k, 1)))

    async def fault_loop(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            for f in self.faults:
                if f.deadline is None and now >= f.stop_at:
                    self.silent.add(f.old_pod)
                    # The last renewal in flight finishes before this is read (one event loop).
                    await asyncio.sleep(0)
                    last = self.last_renew.get(f.old_pod)
                    f.deadline = (last.timestamp() if last else now) + self.a.heartbeat_timeout
            await asyncio.sleep(0.05)

    # --- one size --------------------------------------------------------------------------------------
    async def run_size(self, jobs: int, pids: dict[str, int]) -> dict[str, Any]:
        load = os.getloadavg()[0]
        t_start = time.monotonic()
        # One node per job (8 single-GPU pods of 8 jobs share a node), plus room for the nodes that
        # silenced pods get quarantined on (a HeartbeatTimeout taints the node for every pod).
        await self.ensure_nodes(max(jobs, WORKERS_PER_JOB) + len(self.faults) + self.a.faults + 2)
        nodes_ready_s = time.monotonic() - t_start
        first_new = self.jobs_created
        await self.create_jobs(jobs)
        new = [f"job-{i:04d}" for i in range(first_new, jobs)]
        # Everything Running and heartbeating before the steady window.
        deadline = time.monotonic() + self.a.settle_timeout
        while time.monotonic() < deadline:
            running = sum(
                1
                for p in self.pods.values()
                if p.role == contract.ROLE_WORKER and p.phase == "Running" and not p.deleting
            )
            if running >= jobs * WORKERS_PER_JOB and all(j in self.job_all_pods for j in new):
                break
            await asyncio.sleep(0.5)
        settle_s = time.monotonic() - t_start
        running = sum(
            1 for p in self.pods.values() if p.role == contract.ROLE_WORKER and p.phase == "Running"
        )
        await asyncio.sleep(self.a.heartbeat_interval)  # every pod beat at least once
        await asyncio.sleep(self.a.quiet)  # the creation burst's Events and status writes are over
        create = [self.job_all_pods[j] - self.job_post[j] for j in new if j in self.job_all_pods]
        first = [self.job_first_pod[j] - self.job_post[j] for j in new if j in self.job_first_pod]

        # Steady window: every pod heartbeating, nothing failing: the operator's running cost.
        load = os.getloadavg()[0]
        before = api_counts(await self.apiserver_metrics())
        events0, passes0 = await self.flap_events(), await self.operator_passes()
        renew0, errors0, lag0 = self.renewals, self.renew_errors, len(self.renew_lag)
        win = CpuWindow(pids)
        win.start()
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.a.steady:
            win.sample_rss()
            await asyncio.sleep(1.0)
        cores = win.cores()
        dt = time.monotonic() - t0
        after = api_counts(await self.apiserver_metrics())
        events1, passes1 = await self.flap_events(), await self.operator_passes()
        flaps = {k: v - events0.get(k, 0) for k, v in events1.items() if v > events0.get(k, 0)}
        hb_rate = (self.renewals - renew0) / dt
        hb_errors = self.renew_errors - errors0
        lag = self.renew_lag[lag0:]
        # Faults: K pods (one per job) stop renewing at staggered times; wait for their replacements.
        n_before = len(self.faults)
        self.inject_faults(min(self.a.faults, jobs), jobs, spread=self.a.heartbeat_interval)
        mine = self.faults[n_before:]
        t1 = time.monotonic()
        wait_until = t1 + self.a.heartbeat_timeout + self.a.heartbeat_interval + 60
        while time.monotonic() < wait_until and any(f.replacement_seen is None for f in mine):
            win.sample_rss()
            await asyncio.sleep(0.5)
        repl = [f.replacement_seen - f.deadline for f in mine if f.replacement_seen and f.deadline]
        to_delete = [f.deleted_seen - f.deadline for f in mine if f.deleted_seen and f.deadline]
        del_to_new = [
            f.replacement_seen - f.deleted_seen for f in mine if f.replacement_seen and f.deleted_seen
        ]
        op_reqs = (after.operator - before.operator) / dt
        verbs = {key: (after.by_verb.get(key, 0) - before.by_verb.get(key, 0)) / dt for key in after.by_verb}
        return {
            "jobs": jobs,
            "pods": jobs * (WORKERS_PER_JOB + 1),
            "nodes": self.nodes_created,
            "running_workers": running,
            "load1": round(load, 1),
            "load1_end": round(os.getloadavg()[0], 1),
            "nodes_s": round(nodes_ready_s, 1),
            "settle_s": round(settle_s, 1),
            "create_n": len(create),
            "create_p50": pct(create, 0.5),
            "create_p99": pct(create, 0.99),
            "first_pod_p50": pct(first, 0.5),
            "first_pod_p99": pct(first, 0.99),
            "faults": len(mine),
            "replaced": len(repl),
            "repl_p50": pct(repl, 0.5),
            "repl_p99": pct(repl, 0.99),
            "delete_p50": pct(to_delete, 0.5),
            "delete_p99": pct(to_delete, 0.99),
            "del_to_new_p50": pct(del_to_new, 0.5),
            "hb_per_s": hb_rate,
            "heartbeat_interval_s": self.a.heartbeat_interval,
            "heartbeat_timeout_s": self.a.heartbeat_timeout,
            "passes_per_s": (passes1 - passes0) / dt if passes0 is not None and passes1 is not None else None,
            "flap_events": sum(flaps.values()),
            "flap_events_by_reason": flaps,
            "hb_errors": hb_errors,
            "hb_lag_p99": pct(lag, 0.99),
            "window_s": dt,
            "cores": cores,
            "rss_mb": win.peak_rss,
            "op_req_per_s": op_reqs,
            "api_req_per_s": (after.total - before.total) / dt,
            "req_by_verb": {
                k: round(v, 2) for k, v in sorted(verbs.items(), key=lambda kv: -kv[1]) if v >= 0.05
            },
        }

    async def flap_events(self) -> dict[str, int]:
        """Events so far by reason: every Event on a job, and NodeNotReady (each posted once here)."""
        counts: dict[str, int] = {}
        for path in (
            f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.kind%3D{contract.KIND}",
            "/api/v1/events?fieldSelector=reason%3DNodeNotReady",
        ):
            _status, out = await self.req("GET", path)
            for ev in out.get("items", []) if isinstance(out, dict) else []:
                counts[ev.get("reason", "")] = counts.get(ev.get("reason", ""), 0) + int(ev.get("count") or 1)
        return counts

    async def operator_passes(self) -> float | None:
        """The operator's passes so far (its own /metrics), None when it does not answer."""
        try:
            # Its own session: the admin token of self.http is the apiserver's business only.
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            async with aiohttp.ClientSession() as session, session.get(url) as r:
                found = re.search(r"^rtj_reconcile_duration_seconds_count (\S+)$", await r.text(), re.M)
        except (aiohttp.ClientError, OSError):
            return None
        return float(found.group(1)) if found else None

    async def apiserver_metrics(self) -> str:
        """The apiserver's /metrics (large, slow under load: long timeout, a few tries; "" if none)."""
        for _ in range(3):
            try:
                async with self.http.get(
                    self.server + "/metrics", timeout=aiohttp.ClientTimeout(total=120)
                ) as r:
                    if r.status == 200:
                        return await r.text()
            except (aiohttp.ClientError, TimeoutError) as exc:
                print(f"  /metrics: {exc!r}", file=sys.stderr)
        return ""

    async def main(self) -> list[dict[str, Any]]:
        await self.setup()
        try:
            pid = self.start_operator()
            await self.wait_operator()
            pids = {"operator": pid, "loadgen": os.getpid()}
            for comp in ("kube-apiserver", "etcd", "kwok", "kube-scheduler", "kube-controller-manager"):
                from rtj_local.procs import read_pidfile

                cp = read_pidfile(self.run_dir / "pids" / f"{comp}.pid")
                if cp:
                    pids[comp] = cp
            tasks = [
                asyncio.create_task(c) for c in (self.watch_pods(), self.heartbeat_loop(), self.fault_loop())
            ]
            results = []
            for jobs in self.a.sizes:
                print(f"== {jobs} jobs (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                try:
                    r = await self.run_size(jobs, pids)
                except Exception as exc:
                    print(f"size {jobs} failed: {exc!r}", file=sys.stderr, flush=True)
                    break
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
                print(table([r]).splitlines()[-1], flush=True)  # each row as soon as it is measured
                if self.a.json:
                    Path(self.a.json).write_text(json.dumps(results, indent=2))
                if self.op_proc is not None and self.op_proc.poll() is not None:
                    print("operator exited", file=sys.stderr)
                    break
            self.stop.set()
            for t in tasks:
                t.cancel()
            return results
        finally:
            if self.op_proc is not None and self.op_proc.poll() is None:
                self.op_proc.send_signal(signal.SIGTERM)
                try:
                    self.op_proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    self.op_proc.kill()
            await self.http.close()
            if not self.a.keep_cluster:
                self.cluster.down()


def fmt(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| jobs | pods | nodes | load1 | hb/s | create→pods p50/p99 s | deadline→replacement p50/p99 s (n) "
        "| op CPU cores | op RSS MB | op req/s | op passes/s | apiserver cores | etcd | kwok | sched | kcm "
        "| loadgen | op/apiserver CPU | hb period/timeout s | flap Events |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        c = r["cores"]
        api = c.get("kube-apiserver") or float("nan")
        lines.append(
            f"| {r['jobs']} | {r['pods']} | {r['nodes']} | {r['load1']} | {r['hb_per_s']:.0f} "
            f"| {fmt(r['create_p50'])} / {fmt(r['create_p99'])} "
            f"| {fmt(r['repl_p50'])} / {fmt(r['repl_p99'])} ({r['replaced']}/{r['faults']}) "
            f"| {c['operator']:.2f} | {r['rss_mb'].get('operator', 0):.0f} | {r['op_req_per_s']:.1f} "
            f"| {fmt(r['passes_per_s'], 1)} | {api:.2f} | {c.get('etcd', 0):.2f} | {c.get('kwok', 0):.2f} "
            f"| {c.get('kube-scheduler', 0):.2f} "
            f"| {c.get('kube-controller-manager', 0):.2f} | {c['loadgen']:.2f} | {c['operator'] / api:.2f} "
            f"| {r['heartbeat_interval_s']}/{r['heartbeat_timeout_s']} | {r['flap_events']} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, help="one size (same as --sizes N)")
    ap.add_argument("--sizes", default="10,50", help="comma list of job counts, ramped in one cluster")
    ap.add_argument("--faults", type=int, default=20, help="pods silenced per size (one per job)")
    ap.add_argument("--heartbeat-interval", type=int, default=0, help="0: from --lease-budget")
    ap.add_argument("--heartbeat-timeout", type=int, default=0, help="0: 3 heartbeat intervals")
    ap.add_argument(
        "--lease-budget",
        type=float,
        default=120,
        help="Lease renewals/s this control plane takes next to the rest (docs/benchmarks.md)",
    )
    ap.add_argument(
        "--node-lease-seconds",
        type=int,
        default=40,
        help="KWOK node Lease duration (renewed every quarter of it); grace max(50 s, 1.25x)",
    )
    ap.add_argument("--steady", type=float, default=30, help="seconds of the steady window (no faults)")
    ap.add_argument("--quiet", type=float, default=10, help="seconds after settling before the window")
    ap.add_argument("--settle-timeout", type=float, default=300)
    ap.add_argument("--connections", type=int, default=32, help="load generator keep-alive connections")
    ap.add_argument("--create-concurrency", type=int, default=8)
    ap.add_argument("--run-dir", default=str(ROOT / ".run" / "bench-scale"))
    ap.add_argument("--reuse-cluster", action="store_true")
    ap.add_argument("--keep-cluster", action="store_true")
    ap.add_argument("--operator-env", action="append", default=[], metavar="K=V")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--operator-src", help="directory holding the `rtj` package to run (A/B: baseline)")
    a = ap.parse_args(argv)
    a.sizes = [a.jobs] if a.jobs else [int(s) for s in a.sizes.split(",")]
    if not a.heartbeat_interval:
        a.heartbeat_interval = renew_period(max(a.sizes) * WORKERS_PER_JOB, a.lease_budget)
    a.heartbeat_timeout = a.heartbeat_timeout or 3 * a.heartbeat_interval
    return a


def renew_period(pods: int, budget: float, floor: int = 10) -> int:
    """Seconds between a pod's Lease renewals so that `pods` renew within `budget` writes/s."""
    return max(floor, math.ceil(pods / budget))


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up (operator, cluster) on kill
    results = asyncio.run(Bench(a).main())
    print(
        f"conditions: heartbeat period/timeout {a.heartbeat_interval}/{a.heartbeat_timeout} s, "
        f"KWOK node Lease {a.node_lease_seconds} s (node grace {max(50, a.node_lease_seconds * 5 // 4)} s), "
        f"steady window {a.steady} s, {a.faults} silenced pods per size"
    )
    print(table(results))
    for r in results:
        print(f"\n{r['jobs']} jobs: requests/s by verb (all clients): {r['req_by_verb']}")
        print(
            f"  create n={r['create_n']} "
            f"(first pod p50/p99 {fmt(r['first_pod_p50'])}/{fmt(r['first_pod_p99'])} s), "
            f"settle {r['settle_s']} s; replacement split: deadline→old pod deleted "
            f"p50/p99 {fmt(r['delete_p50'])}/{fmt(r['delete_p99'])} s, "
            f"deleted→new pod p50 {fmt(r['del_to_new_p50'])} s; "
            f"heartbeat errors {r['hb_errors']}, renewal lag p99 {fmt(r['hb_lag_p99'], 3)} s; "
            f"RSS MB { ({k: round(v) for k, v in r['rss_mb'].items()}) }; load1 end {r['load1_end']}"
        )
        api = r["cores"].get("kube-apiserver") or 0.0
        per_renewal = 1000 * api / r["hb_per_s"] if r["hb_per_s"] else float("nan")
        print(
            f"  flapping Events in the steady window (no faults): {r['flap_events_by_reason']}; "
            f"apiserver CPU per renewal (upper bound: all its work / renewals) {per_renewal:.1f} ms"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
