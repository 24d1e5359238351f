"""Recovery on the local cluster (CPU): fault -> first training step after, through the real operator.

    .venv/bin/python bench/recovery_cluster.py [--repeat 2] [--rows a,b,c,d]

The stack is `make demo`'s (rtj_local: a fresh local control plane of its own, the node agent
with p5-shaped nodes whose pods are local process groups, the Helm chart, the operator as a local
process with the chart's RBAC). Jobs are examples/local-cpu-demo.yaml's
(2 nodes x 2 ranks, gloo, FSDP2 example, steps paced to 0.25 s, a checkpoint every 20 steps).
Rows, each fault repeated `--repeat` times in one job, once the job trains again:

a  SIGKILL of one rank -> ft_launcher's in-job restart -> first step after.
b  node death (the agent's kill_node: every process of the node SIGKILLed, no more heartbeats),
   no hot spare: the operator sees the heartbeat deadline pass and creates a replacement pod,
   which is scheduled, starts cold and joins the rendezvous.
c  the same with `hotSpares: 1`: the operator promotes the pre-warmed spare instead.
d  the baseline a plain Job / JobSet / Kubeflow user gets: on the same node death, every worker
   pod is deleted and recreated (the bench does the deleting, as those controllers do; detection
   is granted for free, at the instant of the fault; the operator recreates the deleted pods).

Times: the fault is the wall-clock instant of the kill; "first step" is the first step a rank
logs after a post-fault resume (its RTJ_TRAIN_LOG_DIR lines); the heartbeat deadline is the dead
pod's last Lease renewTime + heartbeatTimeoutSeconds; "replacement" is when a pod watch saw the
new pod (b) or the spare's relabel into the slot (c).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from rtj.api.status_slots import every_slot
from rtj.builders import RDZV_PORT
from rtj.contract import API_GROUP, API_VERSION, LABEL_JOB, LABEL_ROLE, PLURAL, ROLE_WORKER, parse_time
from rtj_local.cluster import LocalCluster
from rtj_local.node_agent import AGENT_LABEL, NodeAgent
from rtj_local.nodes import schedulable
from rtj_local.rawapi import MERGE, RawApi
from rtj_local.stack import OperatorProcess, install_chart
from rtj_local.timeline import Snapshot, Timeline
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for
from rtj_trainer.entrypoint import is_launcher

NAMESPACE = "rtj-bench-recovery"
OPERATOR_NAMESPACE = "rtj-bench-recovery-system"
RELEASE = "rtj-bench-recovery"
NODES = [f"bench-rec-{i}" for i in range(12)]
EXAMPLE = REPO_ROOT / "examples" / "local-cpu-demo.yaml"
TRAIN_LOG_DIR = "/tmp/train-logs"
HEARTBEAT_TIMEOUT = 10.0
START_TIMEOUT = 420.0
RECOVERY_TIMEOUT = 300.0
JOBS_PATH = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}"


# --- the job ---------------------------------------------------------------------------------------
def job_docs(name: str, ckpt_dir: Path, hot_spares: int, trainer_src: Path | None) -> list[dict[str, Any]]:
    """examples/local-cpu-demo.yaml renamed, on our nodes, logging steps, never finishing."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    pv, pvc, rtj = (next(d for d in docs if d["kind"] == k) for k in ("PersistentVolume",
                    "PersistentVolumeClaim", "ResilientTrainingJob"))  # fmt: skip
    pv["metadata"]["name"] = f"{NAMESPACE}-{name}"
    pv["spec"]["hostPath"]["path"] = str(ckpt_dir)
    pvc["metadata"] = {"name": f"{name}-ckpt", "namespace": NAMESPACE}
    pvc["spec"]["volumeName"] = pv["metadata"]["name"]
    rtj["metadata"] = {"name": name, "namespace": NAMESPACE}
    spec = rtj["spec"]
    spec["checkpoint"]["pvc"]["claimName"] = pvc["metadata"]["name"]
    spec["args"] = ["--steps", "100000", "--min-step-time", "0.25", "--log-dir", TRAIN_LOG_DIR]
    spec["env"] = []  # not RTJ_*: the runtime's (the API server refuses them)
    if trainer_src is not None:  # e.g. a `git archive` of a commit, ahead of the editable install
        path = f"{trainer_src / 'trainer-image'}:{trainer_src / 'operator'}"
        spec["env"].append({"name": "PYTHONPATH", "value": path})
    spec["placement"] = {"nodeSelector": {AGENT_LABEL: "true"}}
    spec["hotSpares"] = hot_spares
    ft = spec["faultTolerance"]
    ft.update(
        heartbeatTimeoutSeconds=int(HEARTBEAT_TIMEOUT),
        startupTimeoutSeconds=int(START_TIMEOUT),
        maxInJobRestarts=10,
        maxPodReschedules=20,
    )
    return [pv, pvc, rtj]


# --- observation -----------------------------------------------------------------------------------
class PodWatch:
    """Wall-clock times at which a watch saw each pod appear and each pod become a slot's worker."""

    def __init__(self, api: client.ApiClient, job: str) -> None:
        self.core = client.CoreV1Api(api)
        self.job = job
        self.added: dict[str, float] = {}
        self.worker_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(self.core.list_namespaced_pod, NAMESPACE,
                                   label_selector=f"{LABEL_JOB}={self.job}", timeout_seconds=30):  # fmt: skip
                    t = time.time()
                    pod = ev["object"]
                    name = pod.metadata.name
                    self.added.setdefault(name, t)
                    if (pod.metadata.labels or {}).get(LABEL_ROLE) == ROLE_WORKER:
                        self.worker_at.setdefault(name, t)
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch is resumed; times stay conservative (later)
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop.set()


def step_records(agent: NodeAgent, pods: set[str] | None = None) -> list[dict[str, Any]]:
    """Every rank log line of the job's pods (pod-private /tmp, under the agent's run dir)."""
    out = []
    for path in agent.run_dir.glob(
        f"pods/{NAMESPACE}_*/tmp{TRAIN_LOG_DIR.removeprefix('/tmp')}/rank-*.jsonl"
    ):
        pod = path.parents[2].name.split("_")[1]
        if pods is not None and pod not in pods:
            continue
        key = f"{pod}/{path.name}"
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                rec["file"] = key
                out.append(rec)
    return out


def first_step_after(agent: NodeAgent, t_fault: float) -> float | None:
    """The first step any rank logged after a resume that happened after the fault."""
    by_file: dict[str, list[dict[str, Any]]] = {}
    for rec in step_records(agent):
        by_file.setdefault(rec["file"], []).append(rec)
    firsts = []
    for recs in by_file.values():
        resumed = False
        for rec in recs:  # in file order
            if rec.get("event") == "resume" and rec.get("t", 0) > t_fault:
                resumed = True
            elif resumed and "step" in rec and rec.get("event") is None:
                firsts.append(rec["t"])
                break
    return min(firsts) if firsts else None


def all_training(snap: Snapshot) -> bool:
    slots = every_slot(snap.status)
    return len(slots) == 2 and all(
        snap.leases.get(s.get("pod", ""), {}).get("state") == "Training" for s in slots
    )


def spare_standby(snap: Snapshot) -> bool:
    return any(s.get("state") == "Standby" for s in snap.status.get("spares") or [])


def renew_time(raw: RawApi, pod: str) -> float | None:
    lease = raw.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{pod}")
    renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    return renewed.timestamp() if renewed else None


@dataclass
class Sample:
    row: str
    fault_to_step: float | None = None
    deadline_to_replacement: float | None = None
    detail: str = ""


@dataclass
class Bench:
    cluster: LocalCluster
    raw: RawApi
    api: client.ApiClient
    agent: NodeAgent
    run_dir: Path
    trainer_src: Path | None = None
    samples: list[Sample] = field(default_factory=list)

    # --- a job -----------------------------------------------------------------------------------
    def start_job(self, name: str, hot_spares: int) -> Timeline:
        wait_for(lambda: not _port_bound(RDZV_PORT), timeout=900, interval=2.0,
                 message=f"port {RDZV_PORT} free (another local job's rendezvous holds it)")  # fmt: skip
        ckpt = self.run_dir / "checkpoints" / name
        for doc in job_docs(name, ckpt, hot_spares, self.trainer_src):
            path = {"PersistentVolume": "/api/v1/persistentvolumes",
                    "PersistentVolumeClaim": f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims",
                    "ResilientTrainingJob": JOBS_PATH}[doc["kind"]]  # fmt: skip
            self.raw.request("POST", path, doc)
        tl = Timeline(self.raw, NAMESPACE, name)
        self.await_ready(tl, hot_spares, START_TIMEOUT, "job training")
        return tl

    def await_ready(self, tl: Timeline, hot_spares: int, timeout: float, what: str) -> Snapshot:
        def ready() -> Snapshot | None:
            snap = tl.snapshot()
            if snap.is_true("Failed"):
                raise RuntimeError(f"job failed: {snap.condition('Failed')}")
            ok = all_training(snap) and (hot_spares == 0 or spare_standby(snap))
            return snap if ok else None

        return wait_for(ready, timeout=timeout, interval=1.0, message=what)

    def delete_job(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.raw.request("DELETE", f"{JOBS_PATH}/{name}", propagationPolicy="Foreground")

        def gone() -> bool:
            pods = self.raw.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                    labelSelector=f"{LABEL_JOB}={name}")["items"]  # fmt: skip
            for pod in pods:  # pods of dead nodes never finish terminating: force, as an admin does
                if pod["metadata"].get("deletionTimestamp") and self.agent.is_dead(
                    pod["spec"].get("nodeName", "")
                ):
                    path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
                    with contextlib.suppress(ApiException):
                        self.raw.request("DELETE", path, {"gracePeriodSeconds": 0})
            return self.raw.get(f"{JOBS_PATH}/{name}") is None and not pods

        wait_for(gone, timeout=120, interval=1.0, message=f"job {name} gone")
        for path in (f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{name}-ckpt",
                     f"/api/v1/persistentvolumes/{NAMESPACE}-{name}"):  # fmt: skip
            with contextlib.suppress(ApiException):
                self.raw.request("DELETE", path)

    # --- faults ----------------------------------------------------------------------------------
    def victim(self, snap: Snapshot) -> dict[str, Any]:
        """A slot whose node holds no other pod of the job (not the rendezvous, not the spare)."""
        for slot in every_slot(snap.status):
            node = snap.pods.get(slot["pod"], {}).get("node")
            if node and sum(1 for p in snap.pods.values() if p["node"] == node and not p["deleting"]) == 1:
                return {**slot, "node": node}
        raise RuntimeError(f"no slot alone on its node: {snap.pods}")

    def sigkill_rank(self, snap: Snapshot) -> tuple[float, str]:
        pod = self.victim(snap)["pod"]
        procs = self.agent.pod_processes(NAMESPACE, pod)
        launchers = {p.pid for p in procs if is_launcher(p.cmdline)}
        ranks = [p for p in procs if "RANK" in p.env and p.ppid in launchers]
        target = max(ranks, key=lambda p: int(p.env["RANK"]))
        t = time.time()
        os.kill(target.pid, signal.SIGKILL)
        return t, f"SIGKILL rank {target.env['RANK']} of {pod}"

    def kill_node(self, snap: Snapshot) -> tuple[float, str, str, str]:
        slot = self.victim(snap)
        t = time.time()
        self.agent.kill_node(slot["node"])
        return t, slot["pod"], slot["node"], f"node {slot['node']} ({slot['pod']}) killed"

    def restart_all(self, snap: Snapshot, dead_node: str) -> None:
        """What a JobSet / Kubeflow controller does on a pod failure: delete every worker pod (the
        operator then recreates them). Granted an oracle: the dead node is cordoned at once, so no
        recreated pod lands on it (for 20 s it still looks Ready)."""
        self.raw.request("PATCH", f"/api/v1/nodes/{dead_node}", {"spec": {"unschedulable": True}}, MERGE)
        for slot in every_slot(snap.status):
            with contextlib.suppress(ApiException):
                self.raw.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{slot['pod']}",
                                 {"gracePeriodSeconds": 0})  # fmt: skip

    # --- rows ------------------------------------------------------------------------------------
    def run_row(self, row: str, tl: Timeline, watcher: PodWatch, hot_spares: int) -> Sample:
        snap = self.await_ready(tl, hot_spares, RECOVERY_TIMEOUT, "job training before the fault")
        # A few steps past the last restart, so that old and new generations are told apart.
        sample = Sample(row)
        dead_pod, renew = None, None
        if row == "a":
            t_fault, sample.detail = self.sigkill_rank(snap)
        else:
            t_fault, dead_pod, dead_node, sample.detail = self.kill_node(snap)
            if row == "d":
                self.restart_all(snap, dead_node)
            renew = renew_time(self.raw, dead_pod)  # its last renewal: nothing renews it any more
        step_at = wait_for(lambda: first_step_after(self.agent, t_fault), timeout=RECOVERY_TIMEOUT,
                           interval=0.5, message=f"row {row}: a step after the fault")  # fmt: skip
        sample.fault_to_step = step_at - t_fault
        if row in ("b", "c") and dead_pod is not None:
            assert renew is not None, f"no Lease renewal of {dead_pod} seen"
            deadline = renew + HEARTBEAT_TIMEOUT
            new = {n: t for n, t in (watcher.worker_at if row == "c" else watcher.added).items()
                   if t > t_fault and n != dead_pod}  # fmt: skip
            if row == "c":
                new = {n: t for n, t in new.items() if "-spare-" in n}
            else:
                new = {n: t for n, t in new.items() if "-spare-" not in n and not n.endswith("-rdzv")}
            if new:
                name, t_new = min(new.items(), key=lambda kv: kv[1])
                sample.deadline_to_replacement = t_new - deadline
                sample.detail += f"; replacement {name}"
        print(f"  row {row}: {sample.detail}: fault -> first step {sample.fault_to_step:.1f} s"
              + (f", deadline -> replacement {sample.deadline_to_replacement:+.2f} s"
                 if sample.deadline_to_replacement is not None else ""), flush=True)  # fmt: skip
        return sample


def _port_bound(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.2f} / {statistics.median(values):.2f}"


ROW_TITLES = {
    "a": "a  rank SIGKILL -> in-job restart (ft_launcher)",
    "b": "b  node death -> replacement pod, no hot spare",
    "c": "c  node death -> hot spare promoted (hotSpares: 1)",
    "d": "d  baseline: node death -> restart all pods (JobSet/Kubeflow-style)",
}


def print_table(samples: list[Sample], load: list[str]) -> None:
    print()
    print(f"date {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {os.cpu_count()} cores; {platform.platform()}")
    print(f"load average (1/5/15 min) at start and end: {load[0]} | {load[-1]}")
    print()
    print("| row | n | fault -> first step after, s (min / median) "
          "| heartbeat deadline -> replacement created, s (min / median) |")  # fmt: skip
    print("|---|---|---|---|")
    rows = sorted({s.row for s in samples})
    base = [s.fault_to_step for s in samples if s.row == "d" and s.fault_to_step is not None]
    for row in rows:
        mine = [s for s in samples if s.row == row]
        steps = [s.fault_to_step for s in mine if s.fault_to_step is not None]
        repl = [s.deadline_to_replacement for s in mine if s.deadline_to_replacement is not None]
        ratio = (
            f" ({statistics.median(steps) / statistics.median(base):.2f}x baseline)" if base and steps else ""
        )
        print(f"| {ROW_TITLES[row]} | {len(mine)} | {_stats(steps)}{ratio} | {_stats(repl)} |")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rows", default="a,b,d,c")
    parser.add_argument(
        "--trainer-src",
        type=Path,
        help="a source tree (repo layout) whose rtj_trainer and rtj the pods import instead",
    )
    parser.add_argument(
        "--run-dir", type=Path, default=REPO_ROOT / ".run" / f"bench-recovery-{time.strftime('%H%M%S')}"
    )
    args = parser.parse_args(argv)
    rows = args.rows.split(",")
    args.run_dir = args.run_dir.resolve()  # the operator runs in its own cwd
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still tear the stack down
    load = [_load()]
    print(
        f"== recovery bench: rows {rows}, repeat {args.repeat}, load {load[0]}, run dir {args.run_dir}",
        flush=True,
    )

    # A cluster of its own: only the agent's nodes exist (the rendezvous pod has no node selector, and
    # other sessions' nodes must not run our pods nor ours theirs).
    cluster = LocalCluster(args.run_dir / "cluster")
    cluster.up(nodes=0, fresh=True)
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    raw = RawApi(api)
    if raw.get(f"/api/v1/namespaces/{NAMESPACE}") is None:
        raw.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    agent = NodeAgent(cluster.kubeconfig, args.run_dir / "agent", NODES, lease_duration_seconds=20)
    operator: OperatorProcess | None = None
    bench = Bench(
        cluster, raw, api, agent, args.run_dir, args.trainer_src.resolve() if args.trainer_src else None
    )
    try:
        agent.start()
        wait_for(
            lambda: all(schedulable(raw.get(f"/api/v1/nodes/{n}")) for n in NODES),
            timeout=120,
            message="nodes Ready",
        )
        install_chart(cluster, [NAMESPACE], OPERATOR_NAMESPACE, RELEASE)
        operator = OperatorProcess.from_chart(
            cluster, raw, args.run_dir / "operator", OPERATOR_NAMESPACE, RELEASE
        )
        operator.start()
        plan = [
            ("recovery-a", 0, [r for r in rows if r in "abd"]),
            ("recovery-c", 1, [r for r in rows if r == "c"]),
        ]
        for job, spares, job_rows in plan:
            if not job_rows:
                continue
            print(f"== job {job} (hotSpares {spares}): starting", flush=True)
            tl = bench.start_job(job, spares)
            watcher = PodWatch(api, job).start()
            try:
                for row in job_rows:
                    for _ in range(args.repeat):
                        bench.samples.append(bench.run_row(row, tl, watcher, spares))
            finally:
                watcher.stop()
                bench.delete_job(job)
        load.append(_load())
        print_table(bench.samples, load)
        return 0
    except BaseException:  # also a stop (SIGTERM): print what was measured
        if operator is not None:
            print(f"operator log tail:\n{operator.log_tail(30)}", file=sys.stderr)
        if bench.samples:
            print_table(bench.samples, [*load, _load()])
        raise
    finally:
        if operator is not None:
            operator.stop()
        agent.stop()
        helm = [str(bin_path("helm")), "uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}"]
        subprocess.run(
            [*helm, f"--kubeconfig={cluster.kubeconfig}", "--wait"], capture_output=True, check=False
        )
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())
