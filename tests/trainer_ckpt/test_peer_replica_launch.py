"""The peer replica on the product path, CPU: two pods (`rtj-trainer launch` -> NVRx ft_launcher ->
examples/fsdp_train.py, one gloo rank each) plus `rtj-trainer rendezvous`, real processes. Each pod
runs in a mount namespace of its own with an /etc/hosts naming the per-slot replica Services (as
the local node agent does), its own memory directory (its /dev/shm) and status dir.

Pod 1's node dies (its whole process tree SIGKILLed, its memory deleted) and the checkpoint volume
becomes unreadable (a file where the directory was); a replacement pod of slot 1 starts. The job
must resume from the peer replica at the newest step every rank can get, at most one memory
snapshot interval behind the newest one, and train on."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fsdp_job import VENV_BIN
from rtj.contract import replica_service_name
from rtj_local.procs import free_port, free_port_run, kill_tree
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(900)]

JOB, STEPS, MEMORY_INTERVAL = "fsdp-peer", 400, 2


class TwoPods:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.log_dir = tmp / "logs"
        self.ckpt = tmp / "ckpt"
        self.rdzv_port, self.replica_port = free_port(), free_port_run(2)  # slot s: replica_port + s
        self.hosts = tmp / "hosts"
        names = " ".join(f"{replica_service_name(JOB, s)}.default.svc" for s in (0, 1))
        self.hosts.write_text(Path("/etc/hosts").read_text() + f"\n127.0.0.1 {names}\n")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def config(self, slot: int) -> dict[str, Any]:
        return {
            "jobName": JOB,
            "command": [str(VENV_BIN / "python"), "-m", "rtj_trainer.examples.fsdp_train"],
            "args": ["--steps", str(STEPS), "--log-dir", str(self.log_dir), "--min-step-time", "0.1"],
            "nnodes": 2,
            "nprocPerNode": 1,
            "rdzvEndpoint": f"127.0.0.1:{self.rdzv_port}",
            "rdzvId": f"peer-{self.rdzv_port}",
            "maxInJobRestarts": 5,
            "heartbeatIntervalSeconds": 1,
            "rankHangTimeoutSeconds": 120,
            "rankInitialTimeoutSeconds": 300,
            "inProcess": {
                "enabled": False,
                "softTimeoutSeconds": 60,
                "hardTimeoutSeconds": 90,
                "maxRestarts": 0,
            },
            "checkpointDir": str(self.ckpt),
            "checkpointIntervalSteps": 10,
            "checkpointsToKeep": 2,
            "memorySnapshotIntervalSteps": MEMORY_INTERVAL,
            "memorySnapshotDir": str(self.tmp / f"shm-{slot}"),
            "maxNoProgressCycles": 5,
            "doNotRestartExitCodes": [93, 78],
            "peerReplicaPort": self.replica_port,
        }

    def start(self, name: str, cmd: str, slot: int = 0) -> None:
        env = {
            **os.environ,
            "RTJ_TRAINER_CONFIG": json.dumps(self.config(slot)),
            "RTJ_POD_NAME": name,
            "RTJ_NAMESPACE": "default",
            "RTJ_POD_IP": "127.0.0.1",
            "RTJ_STATUS_DIR": str(self.tmp / f"status-{name}"),
            "RTJ_COLLECTIVE_TIMEOUT_SECONDS": "5",
            "RTJ_GRACEFUL_STOP_SECONDS": "10",
            "NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("KUBECONFIG", None)
        argv = [sys.executable, "-m", "rtj_trainer.entrypoint", cmd]
        if cmd == "launch":  # its own /etc/hosts, as the node agent gives each pod
            argv = ["unshare", "--mount", "--", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"',
                    str(self.hosts), *argv]  # fmt: skip
        with open(self.tmp / f"{name}.log", "ab") as out:
            self.procs[name] = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def records(self) -> list[dict[str, Any]]:
        out = []
        for path in self.log_dir.glob("rank-*.jsonl"):
            out += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return out

    def max_step(self) -> int:
        return max((r["step"] for r in self.records() if "loss" in r), default=0)

    def stop(self) -> None:
        for proc in self.procs.values():
            kill_tree(proc.pid)

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log")
        )


def test_a_lost_node_resumes_from_the_peer_replica_with_the_volume_unreadable(tmp_path: Path) -> None:
    pods = TwoPods(tmp_path)
    try:
        pods.start("rdzv", "rendezvous")
        pods.start(f"{JOB}-n0-a0", "launch", 0)
        pods.start(f"{JOB}-n1-a0", "launch", 1)
        wait_for(lambda: pods.max_step() >= 40, 300, message="step 40")
        time.sleep(random.uniform(0.0, 1.0))  # ~0-10 steps: a kill at any point of the interval
        t_kill = kill_tree(pods.procs[f"{JOB}-n1-a0"].pid)
        reached = pods.max_step()
        shutil.rmtree(tmp_path / "shm-1", ignore_errors=True)
        os.rename(pods.ckpt, tmp_path / "ckpt.away")
        pods.ckpt.write_text("the volume is gone\n")
        pods.start(f"{JOB}-n1-a1", "launch", 1)
        resumes = wait_for(
            lambda: (
                len(r := [x for x in pods.records() if x.get("event") == "resume" and x["t"] > t_kill]) >= 2
                and r
            ),
            300,
            message="both ranks to resume after the kill",
        )
        wait_for(lambda: pods.max_step() >= reached + 10, 300, message="10 steps past the kill")
        back = max(r["t"] for r in resumes)
        first = min(r["t"] for r in pods.records() if "loss" in r and r["t"] > back)
    except BaseException:
        print(pods.logs())
        raise
    finally:
        pods.stop()
    steps = {r["step"] for r in resumes}
    print(
        f"step reached {reached}, resumed at {sorted(steps)} from {sorted({r['source'] for r in resumes})}; "
        f"{reached - min(steps)} steps lost; first step {first - t_kill:.1f} s after the kill "
        "(replacement started at once)"
    )
    assert len(steps) == 1 and {r["source"] for r in resumes} == {"peer"}, resumes
    assert reached - min(steps) < 2 * MEMORY_INTERVAL + 2, (reached, steps)
