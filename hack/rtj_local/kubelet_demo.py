"""`make demo`: the product as users run it, on real kubelet nodes: every pod, the operator included, is a
container of an image `make images` built. (`make demo-agent` is the quick look through the node agent.)

    python -m rtj_local.kubelet_demo [--nodes 3] [--keep]

1. cluster up --real-nodes; 3 kubelet nodes with both images loaded into their containerd;
2. helm install of the chart with ci/kubelet-values.yaml: the operator Deployment runs the local image;
3. job A (examples/local-cpu-demo.yaml, trainer image, an exception injected at step 40): Succeeded
   after an in-process restart;
4. job B: the node of one worker dies (kubelet, containerd and its containers killed); the node goes
   NotReady, the pod is replaced on another node, the job Succeeds.
Exit 0 when both jobs succeed; each step's time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from rtj_local.cluster import LocalCluster, default_run_dir
from rtj_local.images import OPERATOR_IMAGE, TRAINER_IMAGE, TRAINER_UID
from rtj_local.kubelet_nodes import KubeletNodes
from rtj_local.stack import KUBELET_VALUES, RELEASE, install_chart
from rtj_local.train_log import fault_times, job_train_logs, steps_lost, train_log_args
from rtj_local.versions import REPO_ROOT
from rtj_local.wait import wait_for

NAMESPACE = "team-a"
OPERATOR_NAMESPACE = "rtj-system"
EXAMPLE = REPO_ROOT / "examples" / "local-cpu-demo.yaml"
CHECKPOINTS = Path("/var/tmp/rtj/kubelet-demo-checkpoints")


def job_manifests(name: str, steps: int, args: list[str], min_step_time: float) -> list[dict]:
    """The CPU example, on our trainer image, with its checkpoint PV at CHECKPOINTS/<name> and `args`
    added to the trainer's."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    for doc in docs:
        kind = doc["kind"]
        if kind == "PersistentVolume":
            doc["metadata"]["name"] = f"rtj-kubelet-demo-{name}"
            doc["spec"]["hostPath"]["path"] = str(CHECKPOINTS / name)
        elif kind == "PersistentVolumeClaim":
            doc["metadata"].update(name=f"{name}-checkpoints", namespace=NAMESPACE)
            doc["spec"]["volumeName"] = f"rtj-kubelet-demo-{name}"
        elif kind == "ResilientTrainingJob":
            doc["metadata"].update(name=name, namespace=NAMESPACE)
            spec = doc["spec"]
            spec["image"] = TRAINER_IMAGE
            # The ranks' step logs on the checkpoint volume: the summary's steps lost per fault.
            mount = spec["checkpoint"].get("mountPath")  # unset: the API's default, train_log_args' too
            log_args = train_log_args(mount) if mount else train_log_args()
            spec["args"] = ["--steps", str(steps), "--min-step-time", str(min_step_time), *log_args, *args]
            spec["checkpoint"]["pvc"]["claimName"] = f"{name}-checkpoints"
    return docs


class KubeletDemo:
    def __init__(self, run_dir: Path, nodes: int) -> None:
        self.cluster = LocalCluster(run_dir)
        self.nodes = KubeletNodes(self.cluster)
        self.count = nodes
        self.t0 = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:7.1f}s] {text}", flush=True)

    def get(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl("get", "-o", "json", *args).stdout)

    def setup(self) -> None:
        self.cluster.up(nodes=0, real_nodes=True)
        self.say(f"control plane up: {self.cluster.server}")
        names = self.nodes.up(self.count, [TRAINER_IMAGE, OPERATOR_IMAGE])
        self.say(f"kubelet nodes Ready, images loaded: {', '.join(names)}")
        self.cluster.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
        install_chart(self.cluster, [NAMESPACE], OPERATOR_NAMESPACE, RELEASE, 300, [KUBELET_VALUES])
        pods = self.get("pods", "-n", OPERATOR_NAMESPACE)["items"]
        where = ", ".join(f"{p['metadata']['name']} on {p['spec'].get('nodeName')}" for p in pods)
        self.say(f"helm install: operator pod Running from {OPERATOR_IMAGE}: {where}")

    def start_job(self, name: str, steps: int, args: list[str]) -> None:
        path = CHECKPOINTS / name
        path.mkdir(parents=True, exist_ok=True)
        for child in path.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        os.chown(path, TRAINER_UID, TRAINER_UID)  # hostPath ignores fsGroup
        self.cluster.apply(job_manifests(name, steps, args, min_step_time=0.2))
        self.say(f"job {name}: applied ({steps} steps)")

    def status(self, name: str) -> dict[str, Any]:
        return self.get("rtj", name, "-n", NAMESPACE).get("status", {})

    def condition(self, name: str, kind: str) -> bool:
        return any(
            c["type"] == kind and c["status"] == "True" for c in self.status(name).get("conditions", [])
        )

    def wait_succeeded(self, name: str, timeout: float) -> None:
        def done() -> bool:
            if self.condition(name, "Failed"):
                raise RuntimeError(f"job {name} Failed: {self.status(name)}")
            return self.condition(name, "Succeeded")

        wait_for(done, timeout, 2.0, lambda: f"job {name} Succeeded; status {self.status(name)}")
        st = self.status(name)
        self.say(
            f"job {name}: Succeeded; restarts {json.dumps(st.get('restarts'))}, "
            f"lost {st.get('lostSeconds')} s"
        )

    def worker_pods(self, name: str) -> list[dict[str, Any]]:
        pods = self.get("pods", "-n", NAMESPACE)["items"]
        return [
            p
            for p in pods
            if p["metadata"]["name"].startswith(f"{name}-n") and p["status"].get("phase") == "Running"
        ]

    def run(self) -> bool:
        self.setup()
        self.start_job("job-a", 120, ["--fault-inject", "exception:1:40"])
        self.wait_succeeded("job-a", 600)
        self.start_job("job-b", 400, [])
        wait_for(
            lambda: (self.status("job-b").get("lastCheckpoint") or {}).get("step"), 600, 2.0, "a checkpoint"
        )
        operator_nodes = {p["spec"]["nodeName"] for p in self.get("pods", "-n", OPERATOR_NAMESPACE)["items"]}
        victims = [p for p in self.worker_pods("job-b") if p["spec"]["nodeName"] not in operator_nodes]
        victim = victims[0] if victims else self.worker_pods("job-b")[0]
        node = victim["spec"]["nodeName"]
        killed_at = time.time()
        self.nodes.kill_node(node)
        self.say(f"job-b: node {node} (pod {victim['metadata']['name']}) killed")

        def not_ready() -> bool:
            conds = self.get("node", node)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] != "True" for c in conds)

        wait_for(not_ready, 120, 1.0, f"node {node} NotReady")
        self.say(f"node {node}: NotReady (node lifecycle controller)")

        def replaced() -> str | None:
            for p in self.worker_pods("job-b"):
                if p["spec"]["nodeName"] != node and p["metadata"]["name"] != victim["metadata"]["name"]:
                    slot = victim["metadata"]["name"].rsplit("-a", 1)[0]
                    if p["metadata"]["name"].startswith(slot):
                        return f"{p['metadata']['name']} on {p['spec']['nodeName']}"
            return None

        self.say(f"job-b: replacement pod {wait_for(replaced, 300, 1.0, 'a replacement pod')}")
        self.wait_succeeded("job-b", 900)
        # What each fault cost, from the ranks' step logs (rtj_local.train_log).
        logs_a = job_train_logs(CHECKPOINTS / "job-a", "job-a")
        faults = [(f"job-a: {key}", logs_a, t) for key, t in fault_times(logs_a).items()]
        faults.append(("job-b: node death", job_train_logs(CHECKPOINTS / "job-b", "job-b"), killed_at))
        costs = [steps_lost(logs, t) for _, logs, t in faults]
        for (what, _, _), cost in zip(faults, costs, strict=True):
            self.say(
                f"{what}: steps lost {cost.lost} ({cost.last_step} done, resumed at {cost.resumed_at} "
                f"from {'/'.join(cost.sources)})"
                if cost
                else f"{what}: no resume after it in the step logs"
            )
        return len(faults) == 2 and all(cost is not None for cost in costs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rtj_local.kubelet_demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--run-dir", type=Path, default=None)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the cluster and nodes running")
    args = parser.parse_args(argv)
    demo = KubeletDemo(args.run_dir or default_run_dir(), args.nodes)
    ok = False
    try:
        ok = demo.run()
    finally:
        if not args.keep:
            demo.nodes.down()
            demo.cluster.down()
    demo.say("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
