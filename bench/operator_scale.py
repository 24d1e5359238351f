"""The operator at scale on the local cluster: jobs x N pods on KWOK p5.48xlarge nodes, heartbeats live.

N is --pods-per-job (8 by default: many small jobs; 512: a few big ones, issue 30). For each size
(jobs, ramped in one cluster: 10 -> 100 -> ..., or 1 -> 4 with --pods-per-job 512) it measures
- create -> all pods created: per job, from the POST of the job to the last of its N + 1 pods (N
  workers + rendezvous) seen on a pod watch (p50/p99; watch delivery included, so an upper bound),
  and, for the slowest job, the same span to its last pod bound to a node (the scheduler) and to its
  last worker Running (KWOK), with each component's CPU over the creation and over the binding, and
  the apiserver's own time in the operator's pod POSTs: what bounds "all pods created";
- heartbeat deadline -> replacement pod: K pods (--faults, spread round-robin over the jobs: with
  one job all K are slots of that job) stop renewing their Lease one after another, the i-th at
  i x --fault-spread / K seconds (one heartbeat period by default: the K silences overlap, every
  one of them begins before the first deadline); from last renewTime + heartbeatTimeoutSeconds to
  the replacement pod (same slot, next attempt) seen on the watch, split into deadline -> old pod
  deleted (operator) and deleted -> replacement seen; the Events posted meanwhile, by reason;
- the size of each job's status (len of json.dumps(status) of a GET, largest job), at the end of
  the steady window and after the faults;
- CPU (cores) and RSS of the operator process, apiserver, etcd, KWOK, scheduler, controller-manager
  and this process (the load generator), from /proc, over a steady window with heartbeats running;
- API requests/s made by the operator, counted by the apiserver: the operator runs as a
  ServiceAccount outside kube-system, the only client of APF flow schema `service-accounts`
  (apiserver_flowcontrol_dispatched_requests_total); everything else here is system:masters or a
  kube-system component. Its writes (create/update/patch/delete/deletecollection) go to a flow
  schema of their own that this bench adds (OP_WRITES_FLOW_SCHEMA: the operator's ServiceAccount,
  those verbs, the same priority level), so writes/s = that schema's dispatched requests/s;
- API writes/s of the heartbeat load generator (its own count of Lease PATCH/POST requests sent),
  and its successful renewals/s;
- the operator's passes/s (its rtj_reconcile_duration_seconds_count) in the steady window, and
  the flapping Events posted in it with no fault injected: every Event on a job (there is nothing
  to report) and every NodeNotReady (KWOK's node Leases missing their grace).

Heartbeat period: `--heartbeat-interval 0` (the default) picks it from the Lease write budget
(`--lease-budget`, renewals/s this control plane can take next to everything else), as
docs/benchmarks.md explains: period = max(10 s, pods / budget), timeout = 3 periods. The value goes
into the jobs' spec.faultTolerance; each pod is then renewed at the period its own TrainerConfig
(RTJ_TRAINER_CONFIG) carries, as the trainer's agent does, so an operator that lengthens the period
(a cluster heartbeat budget) is followed. `--heartbeat-interval 10 --heartbeat-timeout 60
--operator-env RTJ_...=...` leaves the period to the operator.

The load generator is this process: one aiohttp session (keep-alive) renewing every Running worker
pod's Lease every --heartbeat-interval seconds with the body the trainer's heartbeat agent writes
(rtj.contract labels, annotation and Heartbeat JSON; strategic merge patch, POST on 404), phases
spread evenly. Its CPU is reported in its own column, never charged to the operator.

Jobs use gpusPerNode=1, so the pods of a job share no node (the operator's anti-affinity) while 8
pods of different jobs share a (p5, 8-GPU) node: nodes = max(pods per job, ceil(jobs x pods per job
/ 8)) (1,000 jobs x 8 pods = 8,000 pods on 1,000 p5 nodes; 4 x 512 = 2,048 pods on 512), plus one
per fault and 2 (a silenced pod's node is quarantined).

    .venv/bin/python bench/operator_scale.py --jobs 50                 # quick (make bench)
    .venv/bin/python bench/operator_scale.py --sizes 10,100,300,1000   # the big run (manual)
    flock /tmp/rtj-heavy.lock .venv/bin/python bench/operator_scale.py --jobs 1000 --steady 120
    flock /tmp/rtj-cluster.lock .venv/bin/python bench/operator_scale.py --sizes 1,4 \
        --pods-per-job 512 --faults 8 --steady 60                     # big jobs (issue 30)
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
OP_WRITES_FLOW_SCHEMA = "rtj-scale-operator-writes"
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
JOBS_PATH = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}"
LEASES_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def pod_heartbeat_interval(pod: dict[str, Any], default: float) -> float:
    """The Lease renew period the trainer's agent in this pod would use: its TrainerConfig's."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == contract.ENV_TRAINER_CONFIG and e.get("value"):
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    return float(json.loads(e["value"])["heartbeatIntervalSeconds"])
    return default


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
    operator: float  # requests dispatched for the operator's flow schemas (reads + writes)
    total: float  # all requests the apiserver served
    by_verb: dict[str, float]  # operator-only resources: verb/resource -> count (all clients)
    operator_writes: float = float("nan")  # requests dispatched for OP_WRITES_FLOW_SCHEMA
    pod_post_seconds: float = float("nan")  # apiserver time in POST pods (sum of durations)
    pod_posts: float = float("nan")  # POST pods requests (the operator is the only pod creator)


def api_counts(text: str) -> ApiCounts:
    if not text:  # no /metrics answer: rates come out as nan, not as wrong numbers
        return ApiCounts(float("nan"), float("nan"), {})
    dispatched = parse_counters(text, "apiserver_flowcontrol_dispatched_requests_total")
    op = sum(
        v for labels, v in dispatched if labels.get("flow_schema") in (OP_FLOW_SCHEMA, OP_WRITES_FLOW_SCHEMA)
    )
    op_writes = sum(v for labels, v in dispatched if labels.get("flow_schema") == OP_WRITES_FLOW_SCHEMA)

    def pod_posts(name: str) -> float:
        return sum(
            v
            for labels, v in parse_counters(text, name)
            if labels.get("verb") == "POST"
            and labels.get("resource") == "pods"
            and not labels.get("subresource")
        )

    post_s = pod_posts("apiserver_request_duration_seconds_sum")
    posts = pod_posts("apiserver_request_duration_seconds_count")
    total, by_verb = 0.0, {}
    for labels, v in parse_counters(text, "apiserver_request_total"):
        total += v
        sub = labels.get("subresource")
        key = f"{labels.get('verb')} {labels.get('resource')}{'/' + sub if sub else ''}"
        if not labels.get("code", "200").startswith("2"):
            key += f" {labels.get('code')}"
        by_verb[key] = by_verb.get(key, 0.0) + v
    return ApiCounts(op, total, by_verb, op_writes, post_s, posts)


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
    interval: float = 10.0  # heartbeat period: the pod's TrainerConfig's, then its Lease's (as the agent)
    bound: float | None = None  # wall clock when first seen with spec.nodeName (the scheduler's bind)
    running: float | None = None  # wall clock when first seen Running (KWOK)


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
        self.job_last_bound: dict[str, float] = {}  # job -> wall time its last first-attempt pod was bound
        self.job_last_running: dict[str, float] = {}  # job -> wall time its last first-attempt worker ran
        self.job_counts: dict[str, list[int]] = {}  # job -> [first-attempt pods seen, bound, workers running]
        self.silent: set[str] = set()
        self.faults: list[Fault] = []
        self.last_renew: dict[str, datetime] = {}
        self.acquire: dict[str, str] = {}
        self.step = 0
        self.heap: list[tuple[float, str]] = []
        self.scheduled: set[str] = set()
        self.renewals = 0
        self.period_changes = 0  # pods that took a renew period the operator asked for on their Lease
        self.renew_errors = 0
        self.lease_writes = 0  # PATCH/POST requests the load generator sent (each one an API write)
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
        crd = yaml.safe_load(Path(self.a.crd).read_text())
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
        # The operator's writes in a flow schema of their own (same priority level as the reads'
        # `service-accounts`), so the apiserver counts them apart (apiserver_flowcontrol_*).
        flow_schema = {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": OP_WRITES_FLOW_SCHEMA},
            "spec": {
                "matchingPrecedence": 8000,
                "priorityLevelConfiguration": {"name": "workload-low"},
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [
                            {"kind": "ServiceAccount", "serviceAccount": {"name": OP_SA, "namespace": OP_NS}}
                        ],
                        "resourceRules": [
                            {
                                "verbs": WRITE_VERBS,
                                "apiGroups": ["*"],
                                "resources": ["*"],
                                "clusterScope": True,
                                "namespaces": ["*"],
                            }
                        ],
                    }
                ],
            },
        }
        await self.must("POST", "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", flow_schema)
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
                # --operator-profile: cProfile of the operator's main thread (kopf's event loop; the
                # API calls' worker threads are not in it), written when it exits on SIGTERM.
                *(["-m", "cProfile", "-o", self.a.operator_profile] if self.a.operator_profile else []),
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
                "nodes": self.a.pods_per_job,
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
                interval=pod_heartbeat_interval(obj, self.a.heartbeat_interval),
            )
            self.pods[name] = info
            self.on_new_pod(info, now)
        info.phase = (obj.get("status") or {}).get("phase") or "Pending"
        info.deleting = bool(meta.get("deletionTimestamp")) or kind == "DELETED"
        counts = self.job_counts.get(info.job)
        if info.bound is None and (obj.get("spec") or {}).get("nodeName"):
            info.bound = now
            if counts is not None and info.attempt == 0:
                counts[1] += 1
                if counts[1] == self.a.pods_per_job + 1:
                    self.job_last_bound[info.job] = now
        if info.running is None and info.phase == "Running":
            info.running = now
            if counts is not None and info.attempt == 0 and info.role == contract.ROLE_WORKER:
                counts[2] += 1
                if counts[2] == self.a.pods_per_job:
                    self.job_last_running[info.job] = now
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
            heapq.heappush(self.heap, (time.monotonic() + random.uniform(0, info.interval), name))

    def on_new_pod(self, info: PodInfo, now: float) -> None:
        if info.job in self.job_post:
            self.job_first_pod.setdefault(info.job, now)
        if info.job in self.job_post and info.attempt == 0:
            counts = self.job_counts.setdefault(info.job, [0, 0, 0])
            counts[0] += 1
            if counts[0] == self.a.pods_per_job + 1:
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
                "leaseDurationSeconds": contract.lease_duration_seconds(pod.interval),  # as the agent
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
            self.lease_writes += 1
            status, out = await self.req(
                "PATCH",
                f"{LEASES_PATH}/{body['metadata']['name']}",
                body,
                "application/strategic-merge-patch+json",
            )
            if status == 404:
                self.lease_writes += 1
                status, out = await self.req("POST", LEASES_PATH, body)
            if status >= 300:
                raise RuntimeError(f"{status} {str(out)[:200]}")
            self.renewals += 1
            self.last_renew[name] = now
            # The period the operator asks of a running pod (the heartbeat budget), as the agent takes it.
            asked = contract.parse_renew_period(((out or {}).get("metadata") or {}).get("annotations"))
            if asked is not None and asked != pod.interval:
                pod.interval = float(asked)
                self.period_changes += 1
        except Exception as exc:
            self.renew_errors += 1
            if self.renew_errors < 5:
                print(f"  lease {name}: {exc!r}", file=sys.stderr)
        heapq.heappush(self.heap, (time.monotonic() + pod.interval, name))

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
        """K Running, heartbeating workers stop renewing, one after another (the i-th at i x spread / K
        seconds): round-robin over the jobs, jobs with fewer faults so far first, each a
        slot not silenced before in this run. One job: K slots of that job."""
        faulted = {(f.job, f.slot) for f in self.faults}
        per_job: dict[str, list[PodInfo]] = {}
        for p in self.pods.values():
            if (
                p.role == contract.ROLE_WORKER
                and p.phase == "Running"
                and not p.deleting
                and p.name in self.last_renew
                and p.name not in self.silent
                and int(p.job.split("-")[1]) < jobs
                and (p.job, p.slot or 0) not in faulted
            ):
                per_job.setdefault(p.job, []).append(p)
        for pods in per_job.values():
            random.shuffle(pods)
        done = {j: sum(1 for f in self.faults if f.job == j) for j in per_job}
        order = sorted(per_job, key=lambda j: (done[j], j))
        picked: list[PodInfo] = []
        while len(picked) < k and any(per_job[j] for j in order):
            for j in order:
                if per_job[j] and len(picked) < k:
                    picked.append(per_job[j].pop())
        t0 = time.time()
        for i, p in enumerate(picked):
            self.faults.append(Fault(p.job, p.slot or 0, p.name, p.attempt, t0 + spread * i / len(picked)))

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
        ppj = self.a.pods_per_job
        load = os.getloadavg()[0]
        t_start = time.monotonic()
        # A job's pods on distinct nodes (anti-affinity), 8 single-GPU pods of different jobs on a p5
        # node, plus room for the nodes that silenced pods get quarantined on (a HeartbeatTimeout
        # taints the node for every pod).
        await self.ensure_nodes(nodes_needed(jobs, ppj) + len(self.faults) + self.a.faults + 2)
        nodes_ready_s = time.monotonic() - t_start
        first_new = self.jobs_created
        new = [f"job-{i:04d}" for i in range(first_new, jobs)]
        # Creation: each component's CPU from the first job POST to the last pod created (the
        # operator's POSTs), then to the last worker Running (scheduler binding, KWOK starting).
        api_c0 = api_counts(await self.apiserver_metrics())
        passes_c0 = await self.operator_passes()
        win_c = CpuWindow(pids)
        win_c.start()
        win_b: CpuWindow | None = None
        cores_create: dict[str, float] = {}
        t_created = t_post = time.time()
        await self.create_jobs(jobs)
        # Everything Running and heartbeating before the steady window.
        deadline = time.monotonic() + self.a.settle_timeout
        while time.monotonic() < deadline:
            (win_b or win_c).sample_rss()
            if win_b is None and all(j in self.job_all_pods for j in new):
                cores_create, t_created = win_c.cores(), time.time()
                win_b = CpuWindow(pids)
                win_b.start()
            running = sum(
                1
                for p in self.pods.values()
                if p.role == contract.ROLE_WORKER and p.phase == "Running" and not p.deleting
            )
            if running >= jobs * ppj and all(j in self.job_all_pods for j in new):
                break
            await asyncio.sleep(0.5)
        settle_s = time.monotonic() - t_start
        if win_b is None:  # not all created within the settle timeout: the whole span is creation
            cores_create, t_created = win_c.cores(), time.time()
        cores_bind = win_b.cores() if win_b is not None else {}
        rss_create = {
            **win_c.peak_rss,
            **{k: max(v, win_c.peak_rss.get(k, 0)) for k, v in (win_b.peak_rss if win_b else {}).items()},
        }
        api_c1 = api_counts(await self.apiserver_metrics())
        passes_c1 = await self.operator_passes()
        running = sum(
            1 for p in self.pods.values() if p.role == contract.ROLE_WORKER and p.phase == "Running"
        )
        await asyncio.sleep(
            max(self.worker_intervals() or [self.a.heartbeat_interval])
        )  # every pod beat once
        await asyncio.sleep(self.a.quiet)  # the creation burst's Events and status writes are over
        create = [self.job_all_pods[j] - self.job_post[j] for j in new if j in self.job_all_pods]
        first = [self.job_first_pod[j] - self.job_post[j] for j in new if j in self.job_first_pod]
        bound = [self.job_last_bound[j] - self.job_post[j] for j in new if j in self.job_last_bound]
        ran = [self.job_last_running[j] - self.job_post[j] for j in new if j in self.job_last_running]
        create_span = (
            max((self.job_all_pods[j] for j in new if j in self.job_all_pods), default=t_created) - t_post
        )
        post_s = api_c1.pod_post_seconds - api_c0.pod_post_seconds
        posts = api_c1.pod_posts - api_c0.pod_posts

        # Steady window: every pod heartbeating, nothing failing: the operator's running cost.
        load = os.getloadavg()[0]
        before = api_counts(await self.apiserver_metrics())
        events0, passes0 = await self.flap_events(), await self.operator_passes()
        renew0, errors0, lag0, writes0 = (
            self.renewals,
            self.renew_errors,
            len(self.renew_lag),
            self.lease_writes,
        )
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
        hb_writes = (self.lease_writes - writes0) / dt
        hb_errors = self.renew_errors - errors0
        lag = self.renew_lag[lag0:]
        intervals = self.worker_intervals()
        status_steady = await self.status_sizes()
        # Faults: K pods (round-robin over the jobs; one job: K of its slots) stop renewing at
        # staggered times; wait for their replacements.
        n_before = len(self.faults)
        self.inject_faults(
            self.a.faults, jobs, spread=self.a.fault_spread or max(intervals or [self.a.heartbeat_interval])
        )
        mine = self.faults[n_before:]
        t1 = time.monotonic()
        wait_until = t1 + self.a.heartbeat_timeout + self.a.fault_spread + max(intervals or [0]) + 60
        while time.monotonic() < wait_until and any(f.replacement_seen is None for f in mine):
            win.sample_rss()
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # the replacement pass's status write and Events
        events2 = await self.flap_events()
        fault_events = {k: v - events1.get(k, 0) for k, v in events2.items() if v > events1.get(k, 0)}
        status_faults = await self.status_sizes()
        repl = [f.replacement_seen - f.deadline for f in mine if f.replacement_seen and f.deadline]
        to_delete = [f.deleted_seen - f.deadline for f in mine if f.deleted_seen and f.deadline]
        del_to_new = [
            f.replacement_seen - f.deleted_seen for f in mine if f.replacement_seen and f.deleted_seen
        ]
        op_reqs = (after.operator - before.operator) / dt
        op_writes = (after.operator_writes - before.operator_writes) / dt
        verbs = {key: (after.by_verb.get(key, 0) - before.by_verb.get(key, 0)) / dt for key in after.by_verb}
        create_verbs = {
            key: api_c1.by_verb.get(key, 0) - api_c0.by_verb.get(key, 0) for key in api_c1.by_verb
        }
        return {
            "jobs": jobs,
            "pods_per_job": ppj,
            "pods": jobs * (ppj + 1),
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
            # "All pods created", split: POST -> last pod created (the operator's POSTs returning,
            # as seen on the watch) -> last pod bound (scheduler) -> last worker Running (KWOK).
            "bound_p99": pct(bound, 0.99),
            "running_p99": pct(ran, 0.99),
            "create_span_s": round(create_span, 2),
            "create_cores": cores_create,
            "bind_cores": cores_bind,
            "create_rss_mb": rss_create,
            "create_passes": (passes_c1 - passes_c0)
            if passes_c0 is not None and passes_c1 is not None
            else None,
            "create_op_writes": api_c1.operator_writes - api_c0.operator_writes,
            "create_pod_posts": posts,
            "create_pod_post_ms": 1000 * post_s / posts if posts else None,
            # Mean POST pods in flight at the apiserver over the creation span: the operator keeps up
            # to executor.PARALLEL_CALLS (16) per pass in flight; far fewer: it did not feed them.
            "create_posts_in_flight": post_s / create_span if create_span > 0 else None,
            "create_verbs": {
                k: round(v) for k, v in sorted(create_verbs.items(), key=lambda kv: -kv[1]) if v >= 1
            },
            "bound_by": bound_by(
                create, bound, ran, cores_create, post_s / create_span if create_span > 0 else None
            ),
            "faults": len(mine),
            "faults_in_jobs": len({f.job for f in mine}),
            "fault_spread_s": self.a.fault_spread or max(intervals or [self.a.heartbeat_interval]),
            "replaced": len(repl),
            "repl_p50": pct(repl, 0.5),
            "repl_p99": pct(repl, 0.99),
            "repl_max": max(repl) if repl else None,
            "delete_p50": pct(to_delete, 0.5),
            "delete_p99": pct(to_delete, 0.99),
            "del_to_new_p50": pct(del_to_new, 0.5),
            "fault_events_by_reason": fault_events,
            "hb_per_s": hb_rate,
            "hb_writes_per_s": hb_writes,
            "lease_budget": self.a.lease_budget,
            "heartbeat_interval_s": self.a.heartbeat_interval,
            "heartbeat_timeout_s": self.a.heartbeat_timeout,
            "pod_interval_min_s": min(intervals) if intervals else None,
            "pod_interval_max_s": max(intervals) if intervals else None,
            "pods_that_took_a_new_period": self.period_changes,  # from the operator, on their Lease
            "passes_per_s": (passes1 - passes0) / dt if passes0 is not None and passes1 is not None else None,
            "flap_events": sum(flaps.values()),
            "flap_events_by_reason": flaps,
            "hb_errors": hb_errors,
            "hb_lag_p99": pct(lag, 0.99),
            "window_s": dt,
            "cores": cores,
            "rss_mb": win.peak_rss,
            "op_req_per_s": op_reqs,
            "op_writes_per_s": op_writes,
            "api_req_per_s": (after.total - before.total) / dt,
            "status_bytes": status_steady["max_bytes"],
            "status_slots": status_steady["max_slots"],
            "status_bytes_faults": status_faults["max_bytes"],
            "status_bytes_by_job": status_faults["by_job"],
            "req_by_verb": {
                k: round(v, 2) for k, v in sorted(verbs.items(), key=lambda kv: -kv[1]) if v >= 0.05
            },
        }

    def worker_intervals(self) -> list[float]:
        """The renew periods of the Running workers (from their own TrainerConfig)."""
        return [
            p.interval for p in self.pods.values() if p.role == contract.ROLE_WORKER and p.phase == "Running"
        ]

    async def status_sizes(self) -> dict[str, Any]:
        """Each job's status size: len(json.dumps(status)) of a GET (bytes of JSON as the API serves it)."""
        by_job: dict[str, int] = {}
        slots: dict[str, int] = {}
        for i in range(self.jobs_created):
            name = f"job-{i:04d}"
            status, out = await self.req("GET", f"{JOBS_PATH}/{name}")
            if status == 200 and isinstance(out, dict):
                st = out.get("status") or {}
                by_job[name] = len(json.dumps(st))
                slots[name] = len(st.get("nodeSlots") or [])
        return {
            "max_bytes": max(by_job.values(), default=None),
            "max_slots": max(slots.values(), default=None),
            "by_job": by_job,
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


def kib(n: float | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"


def period(r: dict[str, Any]) -> str:
    """The spec's heartbeat period, and the pods' own when the operator gave them another."""
    lo, hi = r.get("pod_interval_min_s"), r.get("pod_interval_max_s")
    spec = r["heartbeat_interval_s"]
    if lo is None or (lo == hi == spec):
        return f"{spec}"
    return f"{spec} (pods {lo:g}{'' if lo == hi else f'-{hi:g}'})"


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| jobs | pods | nodes | load1 | hb/s | create→pods p50/p99 s | deadline→replacement p50/p99 s (n) "
        "| op CPU cores | op RSS MB | op req/s | op passes/s | apiserver cores | etcd | kwok | sched | kcm "
        "| loadgen | op/apiserver CPU | hb period/timeout s | flap Events "
        "| pods/job | last pod created / bound / Running s | status KiB (after faults) "
        "| op writes/s | loadgen writes/s |"
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
            f"| {period(r)}/{r['heartbeat_timeout_s']} | {r['flap_events']} "
            f"| {r.get('pods_per_job', WORKERS_PER_JOB)} "
            f"| {fmt(r.get('create_p99'), 1)} / {fmt(r.get('bound_p99'), 1)} "
            f"/ {fmt(r.get('running_p99'), 1)} "
            f"| {kib(r.get('status_bytes'))} ({kib(r.get('status_bytes_faults'))}) "
            f"| {fmt(r.get('op_writes_per_s'), 1)} | {fmt(r.get('hb_writes_per_s'), 1)} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, help="one size (same as --sizes N)")
    ap.add_argument("--sizes", default="10,50", help="comma list of job counts, ramped in one cluster")
    ap.add_argument(
        "--faults",
        type=int,
        default=20,
        help="pods silenced per size, round-robin over the jobs (one job: that many of its slots)",
    )
    ap.add_argument(
        "--fault-spread",
        type=float,
        default=0,
        help="the i-th of K silences begins i x this / K s after the first (0: one heartbeat period)",
    )
    ap.add_argument(
        "--pods-per-job",
        type=int,
        default=WORKERS_PER_JOB,
        help="workers per job (spec.nodes, gpusPerNode 1); 512: the big-job rows of issue 30",
    )
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
    ap.add_argument(
        "--crd",
        default=str(ROOT / "crds" / f"{contract.PLURAL}.{contract.API_GROUP}.yaml"),
        help="the CRD to install (with --operator-src: that tree's)",
    )
    ap.add_argument("--operator-profile", help="run the operator under cProfile, stats written here")
    a = ap.parse_args(argv)
    a.sizes = [a.jobs] if a.jobs else [int(s) for s in a.sizes.split(",")]
    if not a.heartbeat_interval:
        a.heartbeat_interval = renew_period(max(a.sizes) * a.pods_per_job, a.lease_budget)
    a.heartbeat_timeout = a.heartbeat_timeout or 3 * a.heartbeat_interval
    return a


def nodes_needed(jobs: int, pods_per_job: int, gpus_per_node: int = 8) -> int:
    """p5 nodes for `jobs` jobs of `pods_per_job` single-GPU pods: a job's pods on distinct nodes (the
    operator's anti-affinity), pods of different jobs sharing a node up to its 8 GPUs."""
    return max(pods_per_job, math.ceil(jobs * pods_per_job / gpus_per_node))


def bound_by(
    create: list[float],
    bound: list[float],
    running: list[float],
    create_cores: dict[str, float],
    posts_in_flight: float | None,
) -> str:
    """Which component the "all pods created" span waited on: the operator while it had fewer POSTs in
    flight than it may (16 per pass) and was busy, else the apiserver answering them; the scheduler
    or KWOK for what came after the last create (binding, starting)."""
    if not create:
        return "not all pods created"
    op, api = create_cores.get("operator", 0.0), create_cores.get("kube-apiserver", 0.0)
    etcd = create_cores.get("etcd", 0.0)
    if posts_in_flight is not None and posts_in_flight < 4 and op >= 0.5:
        created = f"operator (busy {op:.2f} core, {posts_in_flight:.1f} POSTs in flight)"
    else:
        flight = "-" if posts_in_flight is None else f"{posts_in_flight:.1f}"
        created = (
            f"apiserver+etcd ({api:.2f}+{etcd:.2f} cores, {flight} POSTs in flight; operator {op:.2f} core)"
        )
    tail = ""
    if bound and running:
        tail = (
            f"; then scheduler binding +{max(bound) - max(create):.1f} s, "
            f"KWOK Running +{max(running) - max(bound):.1f} s"
        )
    return created + tail


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
        cc, bc = r.get("create_cores") or {}, r.get("bind_cores") or {}
        print(
            f"  all pods created: job POST -> last pod created p99 {fmt(r.get('create_p99'))} s, "
            f"-> last bound {fmt(r.get('bound_p99'))} s, "
            f"-> last worker Running {fmt(r.get('running_p99'))} s; "
            f"bound by: {r.get('bound_by')}; cores while creating ({r.get('create_span_s')} s) "
            f"{ ({k: round(v, 2) for k, v in cc.items()}) }, then until all Running "
            f"{ ({k: round(v, 2) for k, v in bc.items()}) }; operator passes {r.get('create_passes')}, "
            f"writes {r.get('create_op_writes')}, POST pods {r.get('create_pod_posts')} "
            f"(apiserver {fmt(r.get('create_pod_post_ms'), 1)} ms each, "
            f"{fmt(r.get('create_posts_in_flight'), 1)} in flight on average); peak RSS MB "
            f"{ ({k: round(v) for k, v in (r.get('create_rss_mb') or {}).items()}) }; "
            f"requests {r.get('create_verbs')}"
        )
        print(
            f"  status: {r.get('status_bytes')} bytes ({r.get('status_slots')} nodeSlots) in the steady "
            "window, "
            f"{r.get('status_bytes_faults')} after the faults (by job: {r.get('status_bytes_by_job')}); "
            f"API writes/s: operator {fmt(r.get('op_writes_per_s'))} "
            f"(of {fmt(r['op_req_per_s'])} requests/s), "
            f"heartbeat load generator {fmt(r.get('hb_writes_per_s'))} ({r['hb_per_s']:.1f} renewals/s; "
            f"budget {r.get('lease_budget')}/s)"
        )
        print(
            f"  faults: {r['faults']} in {r.get('faults_in_jobs')} job(s), staggered over "
            f"{r.get('fault_spread_s')} s; replaced {r['replaced']}, deadline->replacement max "
            f"{fmt(r.get('repl_max'))} s; Events meanwhile {r.get('fault_events_by_reason')}"
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
