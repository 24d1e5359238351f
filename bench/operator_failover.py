"""Operator failover: seconds from the active operator's death to the standby's first action.

    flock /tmp/rtj-cluster.lock .venv/bin/python bench/operator_failover.py [--runs 5] \
        [--modes sigkill,sigstop]

On the local cluster (rtj_local: reused if healthy, as the test tiers do), per run: a namespace with
3 KWOK p5 nodes, two operators (`python -m rtj`, leader election on a Lease there, the chart's timing:
lease 5 s, renew deadline 3 s, retry 1 s), a 2-pod job (heartbeat every 1 s, timeout 4 s) whose pods
renew their Leases as the trainer does (the integration tier's Trainers). Once it trains, slot 1's
pod stops renewing (a hard fault pending) and at once the active operator is
- `sigkill`: SIGKILLed (its node's death looks the same from the API server: no release, no renewal),
- `sigstop`: frozen (a partition or a hung node), and let run again once the standby acted, to time
  how soon it ends itself (exit 76, rtj.leader_election's fence);
then the bench polls (every 50 ms) for the standby holding the Lease and for the replacement pod of
slot 1 (the standby's first action). Also counted: HeartbeatTimeout Events naming a healthy pod
(must be 0). Prints one JSON object (runs and min/median/max per figure).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config
from rtj import builders, contract, reasons
from rtj_local.cluster import LocalCluster
from rtj_local.stack import OperatorProcess
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))
from operator_harness import (  # the integration tier's helpers (one per job)
    TRAINER_SERVICE_ACCOUNT,
    OperatorEnv,
    events,
    job_manifest,
    make_nodes,
    running,
)

LEASE = "rtj-operator"
POLL = 0.05


class Jobs:
    """What OperatorEnv needs of the tests' RtjApi."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = client.CustomObjectsApi(api)

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        args = (contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL)
        return self.api.create_namespaced_custom_object(*args, body)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        args = (contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL)
        return self.api.get_namespaced_custom_object(*args, name)


def operator(kubeconfig: Path, namespace: str, identity: str, log: Path) -> OperatorProcess:
    env = {
        "RTJ_LEADER_ELECTION_LEASE": LEASE,
        "RTJ_LEADER_ELECTION_NAMESPACE": namespace,
        "RTJ_LEADER_ELECTION_IDENTITY": identity,
        "RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS": "3600",  # only the Leases say the pods are alive
    }
    return OperatorProcess.for_namespace(kubeconfig, namespace, log, **env)


def holder(coord: client.CoordinationV1Api, namespace: str) -> str:
    lease = coord.read_namespaced_lease(LEASE, namespace)
    return (lease.spec.holder_identity if lease.spec else None) or ""


def one_run(api: client.ApiClient, kubeconfig: Path, run_dir: Path, index: int, mode: str) -> dict[str, Any]:
    core, coord = client.CoreV1Api(api), client.CoordinationV1Api(api)
    namespace = f"fo-bench-{os.getpid()}-{index}"
    core.create_namespace({"metadata": {"name": namespace}})
    core.create_namespaced_service_account(namespace, {"metadata": {"name": TRAINER_SERVICE_ACCOUNT}})
    nodes = make_nodes(core, namespace, 3)
    a = operator(kubeconfig, namespace, "op-a", run_dir / f"{namespace}-a.log")
    b = operator(kubeconfig, namespace, "op-b", run_dir / f"{namespace}-b.log")
    try:
        a.start()
        wait_for(lambda: holder(coord, namespace).startswith("op-a_"), timeout=30, message="op-a leads")
        b.start()
        e = OperatorEnv(api, namespace, nodes, a, Jobs(api))
        e.rtj.create(namespace, job_manifest("train", namespace, 2))
        t = e.trainers("train")
        wait_for(
            lambda: (t.beat(), running(e, "train", 2)())[1], timeout=90, interval=0.3, message="job runs"
        )
        victim = e.workers("train")[1].metadata.name
        t.silent.add(victim)
        assert a.proc is not None
        os.killpg(a.proc.pid, signal.SIGKILL if mode == "sigkill" else signal.SIGSTOP)
        dead = time.monotonic()
        lease_at = acted_at = None
        last_beat = 0.0
        while acted_at is None and time.monotonic() - dead < 60:
            now = time.monotonic()
            if now - last_beat >= 0.5:  # the healthy pod keeps renewing (its interval is 1 s)
                t.beat()
                last_beat = now
            if lease_at is None and holder(coord, namespace).startswith("op-b_"):
                lease_at = time.monotonic()
            pod = e.workers("train").get(1)
            if pod is not None and pod.metadata.name != victim:
                acted_at = time.monotonic()
            time.sleep(POLL)
        row: dict[str, Any] = {
            "mode": mode,
            "to_standby_lease_s": None if lease_at is None else round(lease_at - dead, 2),
            "to_first_action_s": None if acted_at is None else round(acted_at - dead, 2),
        }
        if mode == "sigstop":
            os.killpg(a.proc.pid, signal.SIGCONT)
            resumed = time.monotonic()
            wait_for(lambda: a.proc is not None and a.proc.poll() is not None, timeout=15, interval=0.02,
                     message="the old leader ends itself")  # fmt: skip
            row["old_leader_exit_after_resume_s"] = round(time.monotonic() - resumed, 2)
            row["old_leader_exit_code"] = a.proc.returncode
        # Let the replacement run and the healthy pod be judged a while longer under the new leader.
        wait_for(
            lambda: (t.beat(), running(e, "train", 2)())[1], timeout=60, interval=0.3, message="job runs"
        )
        timeouts = [ev for ev in events(core, namespace, "train") if ev.reason == reasons.HEARTBEAT_TIMEOUT]
        row["heartbeat_timeouts_for_healthy_pods"] = sum(victim not in (ev.message or "") for ev in timeouts)
        row["pods"] = sorted(p.metadata.name for p in e.workers("train").values())
        return row
    finally:
        for op in (a, b):
            if op.proc is not None and op.proc.poll() is None:
                os.killpg(op.proc.pid, signal.SIGCONT)
            op.stop(grace=10)
        custom = client.CustomObjectsApi(api)
        args = (contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL)
        for job in custom.list_namespaced_custom_object(*args)["items"]:
            custom.patch_namespaced_custom_object(
                *args, job["metadata"]["name"], {"metadata": {"finalizers": None}}
            )
            # Its FSx PVs, by the labels that name the job (whatever the PV's name).
            selector = builders.fsx_pv_selector(namespace, job["metadata"]["name"])
            with contextlib.suppress(client.ApiException):
                core.delete_collection_persistent_volume(label_selector=selector)
        core.delete_namespace(namespace)
        for node in nodes:
            core.delete_node(node)


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": min(values),
        "median": round(statistics.median(values), 2),
        "max": max(values),
        "n": len(values),
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def figure(key: str) -> dict[str, float] | None:
        return spread([r[key] for r in rows if r[key] is not None])

    return {
        "to_standby_lease_s": figure("to_standby_lease_s"),
        "to_first_action_s": figure("to_first_action_s"),
        "never_acted": sum(r["to_first_action_s"] is None for r in rows),
        "heartbeat_timeouts_for_healthy_pods": sum(r["heartbeat_timeouts_for_healthy_pods"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode")
    parser.add_argument("--modes", default="sigkill,sigstop")
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / ".run" / "operator-failover")
    args = parser.parse_args(argv)
    args.run_dir.mkdir(parents=True, exist_ok=True)
    cluster = LocalCluster()
    cluster.acquire(nodes=0)
    try:
        crd = REPO_ROOT / "crds" / f"{contract.PLURAL}.{contract.API_GROUP}.yaml"
        kubectl = [str(bin_path("kubectl")), f"--kubeconfig={cluster.kubeconfig}"]
        subprocess.run(
            [*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(crd)],
            check=True,
            capture_output=True,
        )
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        rows = []
        for mode in args.modes.split(","):
            for _ in range(args.runs):
                rows.append(one_run(api, cluster.kubeconfig, args.run_dir, len(rows), mode))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        cluster.release()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    )
    result = {
        "bench": "operator_failover",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit.stdout.strip(),
        "machine": f"{platform.node()}, {os.cpu_count()} cores (shared), the control plane on the same host",
        "election": {"leaseSeconds": 5, "renewDeadlineSeconds": 3, "retrySeconds": 1},
        "job": {"nodes": 2, "heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 4},
        "runs": rows,
        "summary": {mode: summary([r for r in rows if r["mode"] == mode]) for mode in args.modes.split(",")},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
