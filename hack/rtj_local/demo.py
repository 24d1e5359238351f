"""`make demo-agent` (`python -m rtj_local.demo`): the main job end to end on a local, container-less stack
(the quick look; `make demo` runs the product on kubelet nodes: rtj_local.kubelet_demo).

1. A LocalCluster (etcd, kube-apiserver, scheduler, controller-manager; no KWOK nodes) and the local
   node agent with 3 p5-shaped nodes (a kubelet stand-in, LOCAL USE ONLY: each pod is a process group).
2. `helm install` of charts/resilient-training-operator with operator.replicas=0; the operator runs as
   a local process with the chart's own RBAC (its ServiceAccount's token), not as cluster-admin.
3. examples/local-cpu-demo.yaml (2 nodes x 2 ranks, CPU, gloo), with the fault hook armed.
4. Faults, in order, each once the previous one is recovered: an exception in a rank (handled in
   process), a SIGKILL of a rank (ft_launcher in-job restart), the death of a whole node (the pod is
   replaced on another node, the node quarantined). A live timeline is printed throughout.
5. The job must end Succeeded, resumed from its last committed checkpoint; a summary is printed and
   everything is stopped and removed (`--keep` keeps the run dir; a failed demo keeps it for logs).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import logging
import os
import platform
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rtj_trainer.entrypoint import is_launcher

from rtj_local.cluster import LocalCluster
from rtj_local.node_agent import NodeAgent
from rtj_local.nodes import schedulable
from rtj_local.rawapi import RawApi
from rtj_local.stack import OperatorProcess, install_chart
from rtj_local.timeline import Snapshot, Timeline
from rtj_local.train_log import StepsLost, job_train_logs, steps_lost, train_log_args
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

EXAMPLE = REPO_ROOT / "examples" / "local-cpu-demo.yaml"
NAMESPACE = "default"
NODES = [f"local-p5-{i}" for i in range(3)]
#: The first fault is armed through the trainer's own hook (rtj_trainer.examples.fsdp_train):
#: global rank 1 raises before this step, once per job.
EXCEPTION_STEP = 30
#: Each training step is padded to this many seconds so the faults land mid-run on any machine.
MIN_STEP_TIME = 0.25
#: Four ranks importing torch on 2 shared cores can take a minute or more to reach their first step.
STARTUP_TIMEOUT = 240
#: How long the job may take from creation to Succeeded (about 4 minutes on an idle 2-core machine).
JOB_TIMEOUT = 540.0


@dataclass
class FaultRecord:
    name: str
    expected_level: str
    injected_at: float = 0.0
    detected_at: float | None = None
    recovered_at: float | None = None
    step_at_injection: int = 0
    checkpoint_at_injection: int | None = None
    reasons: list[str] = field(default_factory=list)
    detail: str = ""
    first_event: int = 0  # index in the timeline's Events where this fault's window starts


def min_step(snap: Snapshot) -> int:
    """The lowest step the job's current slot pods report (0 when unknown)."""
    steps = [snap.leases.get(s.get("pod", ""), {}).get("step") for s in snap.slots]
    return min((s or 0) for s in steps) if steps else 0


def all_training(snap: Snapshot) -> bool:
    slots = snap.slots
    return bool(slots) and all(
        snap.leases.get(s.get("pod", ""), {}).get("state") == "Training" for s in slots
    )


class Demo:
    def __init__(
        self, run_dir: Path, out: Callable[[str], None] = print, job_timeout: float = JOB_TIMEOUT
    ) -> None:
        self.run_dir = run_dir
        self.job_timeout = job_timeout
        self.out = out
        self.cluster = LocalCluster(run_dir / "cluster")
        self.agent: NodeAgent | None = None
        self.operator: OperatorProcess | None = None
        self.checkpoint_dirs: list[Path] = []

    # --- setup ----------------------------------------------------------------------------------------
    def _example(self) -> list[dict[str, Any]]:
        docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
        for doc in docs:
            if doc["kind"] == "ResilientTrainingJob":
                spec = doc["spec"]
                # Options, not env: a job's spec may not set RTJ_* env (the runtime's).
                spec["args"] = [
                    *spec.get("args", []),
                    *("--min-step-time", str(MIN_STEP_TIME)),
                    *("--fault-inject", f"exception:1:{EXCEPTION_STEP}"),
                    *train_log_args(spec.get("checkpoint", {}).get("mountPath", "/checkpoints")),
                ]
                ft = spec.setdefault("faultTolerance", {})
                ft["startupTimeoutSeconds"] = max(ft.get("startupTimeoutSeconds", 0), STARTUP_TIMEOUT)
            if doc["kind"] == "PersistentVolume" and (doc["spec"].get("hostPath") or {}).get("path"):
                self.checkpoint_dirs.append(Path(doc["spec"]["hostPath"]["path"]))
        return docs

    def setup(self) -> tuple[RawApi, dict[str, Any]]:
        t0 = time.monotonic()
        self.out("== local control plane (etcd, kube-apiserver, scheduler, controller-manager)")
        self.cluster.up(nodes=0, fresh=True)
        raw = self.cluster.raw()
        self.out(f"   {self.cluster.server}, kubeconfig {self.cluster.kubeconfig}")
        self.out(f"== node agent (kubelet stand-in, LOCAL USE ONLY): nodes {', '.join(NODES)}")
        self.agent = NodeAgent(
            self.cluster.kubeconfig, self.run_dir / "agent", NODES, lease_duration_seconds=20
        )
        self.agent.start()
        wait_for(lambda: self._nodes_schedulable(raw), timeout=60, message="agent nodes Ready and untainted")
        self.out("== helm install charts/resilient-training-operator (operator.replicas=0)")
        install_chart(self.cluster, trainer_namespaces=[NAMESPACE])
        self.out("== operator: local process, the chart's args/env, its ServiceAccount token (chart RBAC)")
        self.operator = OperatorProcess.from_chart(self.cluster, raw, self.run_dir / "operator").start()
        self.out(f"   log {self.operator.log_path}")
        docs = self._example()
        for path in self.checkpoint_dirs:  # a fresh demo starts from no checkpoint
            shutil.rmtree(path, ignore_errors=True)
        self.out(f"== kubectl apply -f {EXAMPLE.relative_to(REPO_ROOT)}")
        self.out(f"   + args --fault-inject, --log-dir, --min-step-time {MIN_STEP_TIME};"
                 f" startupTimeoutSeconds {STARTUP_TIMEOUT}")  # fmt: skip
        self.cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps({"kind": "List",
                             "apiVersion": "v1", "items": docs}))  # fmt: skip
        job = next(d for d in docs if d["kind"] == "ResilientTrainingJob")
        self.out(f"   stack up in {time.monotonic() - t0:.0f} s")
        return raw, job

    @staticmethod
    def _nodes_schedulable(raw: RawApi) -> bool:
        return all(schedulable(raw.get(f"/api/v1/nodes/{name}")) for name in NODES)

    # --- faults ---------------------------------------------------------------------------------------
    def _rank_pids(self, pod: str) -> dict[int, int]:
        """Global rank -> pid of the rank processes of `pod`: the training processes ft_launcher
        started (its direct children; helpers forked by a rank share its command line and env)."""
        assert self.agent is not None
        procs = self.agent.pod_processes(NAMESPACE, pod)
        launchers = {p.pid for p in procs if is_launcher(p.cmdline)}
        out = {}
        for proc in procs:
            if "RANK" in proc.env and any("fsdp_train" in c for c in proc.cmdline) and proc.ppid in launchers:
                out[int(proc.env["RANK"])] = proc.pid
        return out

    def _sigkill_rank(self, snap: Snapshot) -> str:
        slot = snap.slots[-1]
        pids = self._rank_pids(slot["pod"])
        rank = max(pids)
        os.kill(pids[rank], signal.SIGKILL)  # from outside, as the OOM killer would
        return f"SIGKILL to global rank {rank} (pid {pids[rank]}) in pod {slot['pod']}"

    def _kill_node(self, snap: Snapshot) -> str:
        assert self.agent is not None
        rdzv_node = next((p["node"] for n, p in snap.pods.items() if n.endswith("-rdzv")), None)
        slot = next(s for s in reversed(snap.slots) if s.get("node") != rdzv_node)
        self.agent.kill_node(slot["node"])
        return f"node {slot['node']} (pod {slot['pod']}) is dead: processes SIGKILLed, no more heartbeats"

    # --- the run --------------------------------------------------------------------------------------
    def run(self) -> bool:
        raw, job = self.setup()
        name = job["metadata"]["name"]
        tl = Timeline(raw, NAMESPACE, name, progress_every=10.0)
        faults = [
            FaultRecord("exception in a rank", "InProcess"),
            FaultRecord("SIGKILL of a rank", "InJob"),
            FaultRecord("death of a whole node", "Pod"),
        ]
        faults[0].detail = f"global rank 1 raises before step {EXCEPTION_STEP} (armed via --fault-inject)"
        counter = {"InProcess": "inProcess", "InJob": "inJob", "Pod": "podReschedules"}
        stage = 0
        base = {"inProcess": 0, "inJob": 0, "podReschedules": 0}
        deadline = time.monotonic() + self.job_timeout
        self.out(f"== timeline of job {NAMESPACE}/{name}")
        self.out(tl.note(f"fault 1/3 armed: {faults[0].detail}"))
        while time.monotonic() < deadline:
            for line in tl.poll():
                self.out(line)
            snap = tl.history[-1]
            if snap.is_true("Failed"):
                self.out(tl.note(f"job Failed: {snap.condition('Failed')}"))
                return False
            if snap.is_true("Succeeded"):
                break
            if stage < len(faults):
                f = faults[stage]
                key = counter[f.expected_level]
                if stage == 0 and not f.injected_at and (fired := self._fired_at(tl)) is not None:
                    f.injected_at, f.step_at_injection = fired, EXCEPTION_STEP - 1
                    f.checkpoint_at_injection = snap.checkpoint_step
                    self.out(
                        tl.note(
                            f"fault 1/3 fired (its marker in the checkpoint dir appeared at t+{fired:.1f}s)"
                        )
                    )
                if f.injected_at and f.detected_at is None and snap.restarts[key] > base[key]:
                    f.detected_at = snap.t
                    self.out(tl.note(f"fault {stage + 1}/3 detected at level {f.expected_level}"))
                recovered_step = EXCEPTION_STEP if stage == 0 else f.step_at_injection
                if f.detected_at is not None and all_training(snap) and min_step(snap) > recovered_step:
                    f.recovered_at = snap.t
                    f.reasons = sorted(
                        {ev.get("reason", "") for ev in tl.events[f.first_event :]} - {"Recovered"}
                    )
                    self.out(
                        tl.note(
                            f"fault {stage + 1}/3 recovered: all ranks training past step {recovered_step}"
                        )
                    )
                    base = dict(snap.restarts)
                    stage += 1
                    continue
                if stage >= 1 and not f.injected_at and self._ready_for(stage, snap, faults):
                    f.injected_at, f.step_at_injection = snap.t, min_step(snap)
                    f.checkpoint_at_injection = snap.checkpoint_step
                    f.first_event = len(tl.events)
                    f.detail = self._sigkill_rank(snap) if stage == 1 else self._kill_node(snap)
                    self.out(tl.note(f"fault {stage + 1}/3 injected: {f.detail}"))
            time.sleep(1.0)  # the timeline's refresh period (a display cadence, not a wait for a state)
        else:
            self.out(tl.note(f"timed out after {self.job_timeout:.0f} s"))
            return False
        self.summary(tl, faults)
        return all(f.recovered_at for f in faults)

    def _fired_at(self, tl: Timeline) -> float | None:
        """When the armed exception fired (timeline seconds): the trainer's hook leaves a marker
        `.fault-<kind>-<rank>-<step>` in the checkpoint directory as it fires."""
        for ckpt_dir in self.checkpoint_dirs:
            marker = ckpt_dir / f".fault-exception-1-{EXCEPTION_STEP}"
            if marker.exists():
                return marker.stat().st_mtime - tl.wall0
        return None

    @staticmethod
    def _ready_for(stage: int, snap: Snapshot, faults: list[FaultRecord]) -> bool:
        prev = faults[stage - 1]
        if not all_training(snap) or prev.recovered_at is None:
            return False
        if stage == 1:
            return min_step(snap) >= EXCEPTION_STEP + 10
        # The node dies once a checkpoint newer than the one before the last fault is committed,
        # so its replacement visibly resumes from a later step.
        ckpt = snap.checkpoint_step or 0
        return ckpt > (prev.checkpoint_at_injection or 0) and min_step(snap) >= ckpt + 5

    # --- summary --------------------------------------------------------------------------------------
    def _steps_lost(self, tl: Timeline, faults: list[FaultRecord]) -> list[StepsLost | None]:
        """Per fault, the steps it cost, from the ranks' step logs (rtj_local.train_log)."""
        logs: dict[str, list[dict[str, Any]]] = {}
        for ckpt_dir in self.checkpoint_dirs:
            logs.update(job_train_logs(ckpt_dir, tl.job))
        return [steps_lost(logs, tl.wall0 + f.injected_at) if f.injected_at else None for f in faults]

    def summary(self, tl: Timeline, faults: list[FaultRecord]) -> None:
        last = tl.history[-1]
        done = last.condition("Succeeded") or {}
        ckpts: list[int] = []
        for snap in tl.history:
            step = snap.checkpoint_step
            if step is not None and (not ckpts or step != ckpts[-1]):
                ckpts.append(step)
        self.out("")
        self.out("== summary")
        self.out(f"job {tl.namespace}/{tl.job}: Succeeded ({done.get('reason', '')}) after {last.t:.0f} s")
        self.out(
            f"{'fault':<24} {'handled at':<11} {'detected':>9} {'recovered':>10} {'steps lost':>10}"
            "  reasons  / what"
        )
        for f, cost in zip(faults, self._steps_lost(tl, faults), strict=True):
            det = f"{f.detected_at - f.injected_at:.1f} s" if f.detected_at is not None else "-"
            rec = f"{f.recovered_at - f.injected_at:.1f} s" if f.recovered_at is not None else "-"
            lost = str(cost.lost) if cost else "-"
            why = ",".join(f.reasons) or "-"
            self.out(f"{f.name:<24} {f.expected_level:<11} {det:>9} {rec:>10} {lost:>10}  {why}")
            self.out(f"{'':24} {f.detail}")
            if cost:
                self.out(
                    f"{'':24} step {cost.last_step} done, resumed at step {cost.resumed_at}"
                    f" from {'/'.join(cost.sources)}"
                )
        r = last.restarts
        self.out(
            f"restarts: in-process {r['inProcess']}, in-job {r['inJob']}, pods {r['podReschedules']}, "
            f"job {r['job']}"
        )
        self.out(f"quarantined nodes: {', '.join(last.status.get('quarantinedNodes') or []) or '-'}")
        monotonic = all(a < b for a, b in itertools.pairwise(ckpts))
        self.out(
            f"committed checkpoints seen: {ckpts} ({'never backwards' if monotonic else 'WENT BACKWARDS'})"
        )
        self.out(f"logs: node agent {self.run_dir / 'node-agent.log'},")
        self.out(
            f"      pods {self.agent.run_dir / 'pods' if self.agent else '-'}/<ns>_<pod>_<uid>/container.log,"
        )
        self.out(
            f"      operator {self.operator.log_path if self.operator else '-'},"
            f" cluster {self.cluster.run_dir}/logs"
        )

    # --- teardown -------------------------------------------------------------------------------------
    def teardown(self) -> None:
        steps: list[Callable[[], None]] = []
        if self.operator:
            steps.append(self.operator.stop)
        if self.agent:
            steps.append(self.agent.stop)
        steps.append(self.cluster.down)
        for step in steps:
            with contextlib.suppress(Exception):
                step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rtj_local.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / ".run" / "demo")
    parser.add_argument("--keep", action="store_true", help="keep the run dir (logs) after a successful run")
    parser.add_argument("--timeout", type=float, default=JOB_TIMEOUT, help="seconds for the job to succeed")
    args = parser.parse_args(argv)
    for name in ("kube-apiserver", "helm", "kubectl"):
        if not bin_path(name).exists():
            print(f"missing {bin_path(name)}: run `make cluster-build` first", file=sys.stderr)
            return 2
    run_dir = args.run_dir.resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    logging.basicConfig(  # the node agent's own log; the terminal is the timeline's
        filename=run_dir / "node-agent.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
    )
    demo = Demo(run_dir, job_timeout=args.timeout)
    # The pods run this environment's trainer runtime: say which NVRx and torch they train with.
    print(
        f"== trainer runtime: NVRx {importlib.metadata.version('nvidia-resiliency-ext')}, "
        f"torch {importlib.metadata.version('torch')}, Python {platform.python_version()}"
    )
    t0 = time.monotonic()
    ok = False
    try:
        ok = demo.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        demo.teardown()
        for path in demo.checkpoint_dirs:
            shutil.rmtree(path, ignore_errors=True)
        if ok and not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
            print(
                f"== cleaned up (processes stopped, {run_dir} removed) in {time.monotonic() - t0:.0f} s total"
            )
        else:
            print(f"== processes stopped; logs kept in {run_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
