"""Runs any training command the way a one-pod job runs it: `rtj-trainer rendezvous` plus
`rtj-trainer launch` (-> NVRx ft_launcher -> gloo ranks), real processes, real files. The command
is the user's (a plain torchrun script, a Hugging Face Trainer script, ...); the test reads back
its logs, the pod's last heartbeat and the launcher's exit code."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtj.contract import Heartbeat
from rtj_local.procs import free_port
from trainer_pods import VENV_BIN, kill_trees, last_heartbeat, pod_env, start_one_pod, trainer_config

__all__ = ["VENV_BIN", "ByoJob", "read_jsonl"]


@dataclass
class ByoJob:
    tmp: Path
    command: list[str]
    nproc: int = 2
    config: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    name: str = "byo"

    def __post_init__(self) -> None:
        self.ckpt_dir = self.tmp / "ckpt"
        self.status_dir = self.tmp / "status"
        self.mem_dir = self.tmp / "shm"  # stands in for the pod's /dev/shm
        self.log = self.tmp / "launch.log"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _env(self, port: int) -> dict[str, str]:
        cfg = trainer_config(
            self.name,
            self.command[:1],
            self.command[1:],
            port,
            self.ckpt_dir,
            nproc_per_node=self.nproc,
            **{
                "rankHangTimeoutSeconds": 60,
                "checkpointIntervalSteps": 10,
                "memorySnapshotIntervalSteps": 0,
                "memorySnapshotDir": str(self.mem_dir),
                **self.config,
            },
        )
        env = {"RTJ_COLLECTIVE_TIMEOUT_SECONDS": "10", "RTJ_GRACEFUL_STOP_SECONDS": "30", **self.env}
        return pod_env(cfg, f"{self.name}-n0-a0", self.status_dir, env)

    def start(self) -> subprocess.Popen[bytes]:
        self.procs.extend(start_one_pod(self._env(free_port()), self.tmp))
        return self.procs[-1]

    def wait(self, timeout: float) -> int:
        try:
            return self.procs[-1].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not finish in {timeout:.0f} s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """Everything this job started, ranks orphaned in their own sessions included."""
        kill_trees(self.procs)

    def log_tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def last_heartbeat(self) -> Heartbeat:
        return last_heartbeat(self.log.read_text(errors="replace"), self.name)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a rank killed while writing its last line
    return out
