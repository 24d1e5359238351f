"""Runs a trainer job on localhost the way pods would: one `rtj-trainer rendezvous` process and one
`rtj-trainer launch` process per "pod", each in its own session, all real processes.

A pod's loss is emulated by SIGKILL of its whole process tree (entrypoint, ft_launcher, rank
monitors, ranks), like a node going away.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rtj.contract import Heartbeat
from rtj_local.procs import free_port, kill_tree
from rtj_local.wait import wait_for
from rtj_trainer.entrypoint import is_launcher
from trainer_pods import kill_trees, last_heartbeat, pod_env, spawn, trainer_config

TOY_TRAIN = Path(__file__).with_name("toy_train.py")


@dataclass
class Pod:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    status_dir: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def last_heartbeat(self) -> Heartbeat:
        return last_heartbeat(self.log_text(), self.name)


@dataclass
class ToyJob:
    tmp: Path
    nnodes: int = 2
    nproc_per_node: int = 2
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    pods: dict[str, Pod] = field(default_factory=dict)
    rdzv: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = free_port()
        self.events_file = self.tmp / "events.jsonl"
        self.ckpt_dir = self.tmp / "ckpt"
        cfg = trainer_config(
            "toy",
            [sys.executable, str(TOY_TRAIN)],
            [],
            self.port,
            self.ckpt_dir,
            nnodes=self.nnodes,
            nproc_per_node=self.nproc_per_node,
            **{
                "rankHangTimeoutSeconds": 20,
                "rankInitialTimeoutSeconds": 90,
                "inProcess": {
                    "enabled": True,
                    "softTimeoutSeconds": 15,
                    "hardTimeoutSeconds": 30,
                    "maxRestarts": 5,
                },
                "maxNoProgressCycles": 2,
                **self.config,
            },
        )
        self.trainer_config = json.dumps(cfg)

    def _spawn(self, name: str, args: list[str], extra_env: dict[str, str] | None = None) -> Pod:
        status_dir = self.tmp / f"status-{name}"
        log = self.tmp / f"{name}.log"
        env = {
            "TOY_EVENTS": str(self.events_file),
            "TOY_STEP_SECONDS": "0.05",
            # Fail collectives fast on a dead peer (well under the in-process hard timeout).
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "3",
            "RTJ_GRACEFUL_STOP_SECONDS": "10",
            "RTJ_LAUNCHER_EXIT_TIMEOUT_SECONDS": "60",
            # Several "pods" on one address: NVRx closes such a rendezvous unless told it is a simulation.
            "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1",
            **self.env,
            **(extra_env or {}),
        }  # KUBECONFIG only where a test gives it: no Lease writes unless a test asks for them
        # = the `rtj-trainer` console script, without needing the distribution installed.
        argv = [sys.executable, "-m", "rtj_trainer.entrypoint", *args]
        proc = spawn(argv, pod_env(self.trainer_config, name, status_dir, env), log, mode="wb")
        return Pod(name, proc, log, status_dir)

    def start_rendezvous(self) -> None:
        pod = self._spawn("rdzv", ["rendezvous"])
        self.rdzv = pod.proc
        wait_for(lambda: _port_open(self.port), 60, message="the rendezvous store to listen")

    def start_pod(self, name: str, extra_env: dict[str, str] | None = None) -> Pod:
        pod = self._spawn(name, ["launch"], extra_env)
        self.pods[name] = pod
        return pod

    def start(self) -> None:
        self.start_rendezvous()
        for i in range(self.nnodes):
            self.start_pod(f"pod{i}")

    # --- observations -----------------------------------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        try:
            lines = self.events_file.read_text().splitlines(keepends=True)
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.endswith("\n")]

    def max_step(self) -> int:
        return max((e["step"] for e in self.events()), default=0)

    def wait_step(self, step: int, timeout: float) -> list[dict[str, Any]]:
        return wait_for(lambda: self.max_step() >= step and self.events(), timeout, message=f"step {step}")

    def pod_of_launcher(self, launcher_pid: int) -> str:
        for name, pod in self.pods.items():
            try:
                if launcher_pid in {c.pid for c in psutil.Process(pod.proc.pid).children()}:
                    return name
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"no pod runs launcher {launcher_pid}")

    def launcher_pids(self) -> dict[str, int]:
        """ft_launcher PID of every pod still running."""
        out = {}
        for name, pod in self.pods.items():
            try:
                children = psutil.Process(pod.proc.pid).children()
                out[name] = next(c.pid for c in children if is_launcher(c.cmdline()))
            except (psutil.NoSuchProcess, StopIteration):
                continue
        return out

    def wait_exit(self, name: str, timeout: float) -> int:
        pod = self.pods[name]
        try:
            return pod.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not exit within {timeout:.0f} s") from None

    # --- faults -----------------------------------------------------------------------------
    def kill_pod(self, name: str) -> float:
        """SIGKILL everything the pod runs at once; returns the time of the kill."""
        return kill_tree(self.pods[name].proc.pid)

    def kill_rendezvous(self) -> float:
        """SIGKILL the rendezvous "pod" (entrypoint and nvrx-control); returns the time of the kill."""
        assert self.rdzv is not None
        return kill_tree(self.rdzv.pid)

    def stop(self) -> None:
        """Tear everything down (test cleanup): every process tree we started."""
        kill_trees([p.proc for p in self.pods.values()] + ([self.rdzv] if self.rdzv else []))
        # Ranks orphaned by a killed launcher run in their own sessions: find them by their env file.
        for p in psutil.process_iter(["cmdline", "environ"]):
            try:
                if str(TOY_TRAIN) in " ".join(p.info["cmdline"] or []) and (p.info["environ"] or {}).get(
                    "TOY_EVENTS"
                ) == str(self.events_file):
                    p.kill()
            except (psutil.Error, TypeError):
                continue

    def dump_logs(self) -> str:
        parts = []
        for name, pod in self.pods.items():
            text = pod.log_text()
            parts.append(f"===== {name} (last 3000 chars) =====\n{text[-3000:]}")
        return "\n".join(parts)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def first_step_after(
    events: list[dict[str, Any]],
    t: float,
    step_above: int = -1,
    exclude_pids: frozenset[int] | set[int] = frozenset(),
    **match: Any,
) -> dict[str, Any] | None:
    """The first event after wall time `t` (optionally past a step, matching fields), from a worker
    process not in `exclude_pids` (the workers that ran before the fault)."""
    for e in sorted(events, key=lambda e: e["t"]):
        if (
            e["t"] > t
            and e["step"] > step_above
            and e["pid"] not in exclude_pids
            and all(e.get(k) == v for k, v in match.items())
        ):
            return e
    return None
