"""Runs rtj_trainer.examples.fsdp_train on CPU the way a one-pod job runs: `rtj-trainer rendezvous`
plus `rtj-trainer launch` (-> NVRx ft_launcher -> 2 gloo ranks), real processes and files; reads
the ranks' step logs back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtj_local.procs import free_port
from trainer_pods import VENV_BIN, pod_env, start_one_pod, trainer_config

__all__ = ["VENV_BIN", "FsdpJob", "segments", "stop"]


@dataclass
class FsdpJob:
    tmp: Path
    steps: int
    faults: str = ""
    checkpoint_interval: int = 20
    memory_interval: int = 0
    extra_args: list[str] = field(default_factory=list)
    name: str = "fsdp-cpu"
    #: TrainerConfig fields (camelCase) and pod environment variables that replace or add.
    config: dict[str, Any] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_dir = self.tmp / "logs"
        self.ckpt_dir = self.tmp / "ckpt"
        self.mem_dir = self.tmp / "shm"  # stands in for the pod's /dev/shm
        self.status_dir = self.tmp / "status"

    def env(self, port: int) -> dict[str, str]:
        cfg = trainer_config(
            self.name,
            [str(VENV_BIN / "python"), "-m", "rtj_trainer.examples.fsdp_train"],
            [
                *("--steps", str(self.steps), "--log-dir", str(self.log_dir), "--min-step-time", "0.05"),
                *self.extra_args,
            ],
            port,
            self.ckpt_dir,
            rdzvId=f"fsdp-{port}",
            checkpointIntervalSteps=self.checkpoint_interval,
            memorySnapshotIntervalSteps=self.memory_interval,
            memorySnapshotDir=str(self.mem_dir),
            **self.config,
        )
        env = {
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "10",
            "RTJ_GRACEFUL_STOP_SECONDS": "30",
            "RTJ_FAULT_INJECT": self.faults,
            **self.extra_env,
        }
        return pod_env(cfg, f"{self.name}-n0-a0", self.status_dir, env)

    def start(self, tag: str = "") -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """(rendezvous, launch) processes, each in its own session; logs under tmp."""
        return start_one_pod(self.env(free_port()), self.tmp, tag)

    def run(self, timeout: float = 600, tag: str = "") -> int:
        rdzv, launch = self.start(tag)
        try:
            return launch.wait(timeout)
        finally:
            stop(rdzv)
            stop(launch)

    def log_tail(self, tag: str = "") -> str:
        return (self.tmp / f"launch{tag}.log").read_text(errors="replace")[-4000:]

    def records(self, rank: int) -> list[dict[str, Any]]:
        try:
            lines = (self.log_dir / f"rank-{rank}.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(x) for x in lines if x.strip()]

    def max_step(self) -> int:
        return max((r["step"] for rank in (0, 1) for r in self.records(rank) if "loss" in r), default=0)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def segments(recs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(resume record, the step records after it) for each (re)start of a rank."""
    out: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for r in recs:
        if r.get("event") == "resume":
            out.append((r, []))
        elif "loss" in r and out:
            out[-1][1].append(r)
    return out
