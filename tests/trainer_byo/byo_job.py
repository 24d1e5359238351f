"""Runs any training command the way a one-pod job runs it: `rtj-trainer rendezvous` plus
`rtj-trainer launch` (-> NVRx ft_launcher -> gloo ranks), real processes, real files. The command
is the user's (a plain torchrun script, a Hugging Face Trainer script, ...); the test reads back
its logs, the pod's last heartbeat and the launcher's exit code."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from rtj.contract import Heartbeat, TrainerConfig
from rtj_local.procs import free_port

VENV_BIN = Path(sys.executable).parent
LAST_HEARTBEAT = re.compile(r"last heartbeat (\{.*\})\s*$", re.M)


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
        cfg: dict[str, Any] = {
            "jobName": self.name,
            "command": self.command[:1],
            "args": self.command[1:],
            "nnodes": 1,
            "nprocPerNode": self.nproc,
            "rdzvEndpoint": f"127.0.0.1:{port}",
            "rdzvId": f"{self.name}-{port}",
            "maxInJobRestarts": 3,
            "heartbeatIntervalSeconds": 1,
            "rankHeartbeatTimeoutSeconds": 60,
            "rankInitialTimeoutSeconds": 300,
            "inProcess": {
                "enabled": True,
                "softTimeoutSeconds": 60,
                "hardTimeoutSeconds": 90,
                "maxRestarts": 3,
            },
            "checkpointDir": str(self.ckpt_dir),
            "checkpointIntervalSteps": 10,
            "checkpointsToKeep": 2,
            "memorySnapshotIntervalSteps": 0,
            "memorySnapshotDir": str(self.mem_dir),
            "maxNoProgressCycles": 3,
            "doNotRestartExitCodes": [93, 78],
        }
        cfg.update(self.config)
        TrainerConfig.model_validate(cfg)  # a typo in a test fails here, not in a pod
        env = {
            **os.environ,
            "RTJ_TRAINER_CONFIG": json.dumps(cfg),
            "RTJ_POD_NAME": f"{self.name}-n0-a0",
            "RTJ_NAMESPACE": "default",
            "RTJ_POD_IP": "127.0.0.1",
            "RTJ_STATUS_DIR": str(self.status_dir),
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "10",
            "RTJ_TERMINATION_GRACE_SECONDS": "30",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        env.pop("KUBECONFIG", None)  # no Lease writes: the heartbeat is read from the log
        return env

    def start(self) -> subprocess.Popen[bytes]:
        port = free_port()
        env = self._env(port)
        for cmd in ("rendezvous", "launch"):
            with open(self.tmp / f"{cmd}.log", "ab") as out:
                self.procs.append(
                    subprocess.Popen(
                        [str(VENV_BIN / "rtj-trainer"), cmd],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        return self.procs[-1]

    def wait(self, timeout: float) -> int:
        try:
            return self.procs[-1].wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the job did not finish in {timeout:.0f} s:\n{self.log_tail()}") from None

    def stop(self) -> None:
        """Everything this job started, ranks orphaned in their own sessions included."""
        for proc in self.procs:
            try:
                root = psutil.Process(proc.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for p in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.send_signal(signal.SIGKILL)
            psutil.wait_procs(tree, timeout=10)
            proc.wait(10)

    def log_tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def last_heartbeat(self) -> Heartbeat:
        found = LAST_HEARTBEAT.findall(self.log.read_text(errors="replace"))
        assert found, f"no final heartbeat in the log:\n{self.log_tail()}"
        return Heartbeat.model_validate_json(found[-1])


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
