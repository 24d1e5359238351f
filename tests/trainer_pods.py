"""Trainer pods as local processes: what the job helpers of the trainer tiers share
(tests/trainer/trainer_harness.py, tests/trainer_ckpt/fsdp_job.py, tests/trainer_byo/byo_job.py).

A pod is its entrypoint (`rtj-trainer rendezvous` or `rtj-trainer launch`) in its own session, with
the environment the operator gives it (`pod_env`: the TrainerConfig of `trainer_config`, the pod's
name and status directory) and its output in one log file, which ends with the pod's last heartbeat
(`last_heartbeat`). Importable from every test directory: pytest's default import mode puts tests/
on sys.path when it loads tests/conftest.py (bench/ scripts insert it themselves).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
from rtj.contract import Heartbeat, TrainerConfig

#: The virtualenv's scripts (`python`, `rtj-trainer`, `torchrun`).
VENV_BIN = Path(sys.executable).parent
LAST_HEARTBEAT = re.compile(r"last heartbeat (\{.*\})\s*$", re.M)


def trainer_config(
    name: str,
    command: list[str],
    args: list[str],
    port: int,
    ckpt_dir: Path,
    *,
    nnodes: int = 1,
    nproc_per_node: int = 2,
    **fields: Any,
) -> dict[str, Any]:
    """A job's TrainerConfig (camelCase, as the operator writes it) with the rendezvous on
    127.0.0.1:`port` and the timeouts of the CPU tiers; `fields` (TrainerConfig's names) replace or
    add. Validated, so that a typo in a test fails here, not in a pod."""
    cfg: dict[str, Any] = {
        "jobName": name,
        "command": command,
        "args": args,
        "nnodes": nnodes,
        "nprocPerNode": nproc_per_node,
        "rdzvEndpoint": f"127.0.0.1:{port}",
        "rdzvId": f"{name}-{port}",
        "maxInJobRestarts": 3,
        "heartbeatIntervalSeconds": 1,
        "rankHangTimeoutSeconds": 120,
        "rankInitialTimeoutSeconds": 300,
        "inProcess": {
            "enabled": True,
            "softTimeoutSeconds": 60,
            "hardTimeoutSeconds": 90,
            "maxRestarts": 3,
        },
        "checkpointDir": str(ckpt_dir),
        "checkpointIntervalSteps": 20,
        "checkpointsToKeep": 2,
        "maxNoProgressCycles": 3,
        "doNotRestartExitCodes": [93, 78],
        **fields,
    }
    TrainerConfig.model_validate(cfg)
    return cfg


def pod_env(
    config: dict[str, Any] | str, pod: str, status_dir: Path, env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """This process's environment plus what a pod's entrypoint reads (its TrainerConfig, name, IP,
    status directory), one thread per rank, unbuffered output, then `env`. KUBECONFIG is dropped
    unless `env` sets it: no Lease writes, the heartbeat is read from the log."""
    extra = dict(env or {})
    out = {
        **os.environ,
        "RTJ_TRAINER_CONFIG": config if isinstance(config, str) else json.dumps(config),
        "RTJ_POD_NAME": pod,
        "RTJ_NAMESPACE": "default",
        "RTJ_POD_IP": "127.0.0.1",
        "RTJ_STATUS_DIR": str(status_dir),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if "KUBECONFIG" not in extra:
        out.pop("KUBECONFIG", None)
    return out


def spawn(argv: list[str], env: Mapping[str, str], log: Path, mode: str = "ab") -> subprocess.Popen[bytes]:
    """`argv` in its own session (so its own process group), stdout and stderr into `log`."""
    with open(log, mode) as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def start_one_pod(
    env: Mapping[str, str], log_dir: Path, tag: str = ""
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """(rendezvous, launch): a one-pod job's two entrypoints, `rtj-trainer rendezvous` and
    `rtj-trainer launch`, logging to `<log_dir>/rendezvous<tag>.log` and `launch<tag>.log`."""
    rdzv, launch = (
        spawn([str(VENV_BIN / "rtj-trainer"), cmd], env, log_dir / f"{cmd}{tag}.log")
        for cmd in ("rendezvous", "launch")
    )
    return rdzv, launch


def kill_trees(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """SIGKILL each process and all its descendants, and wait for them (test cleanup)."""
    for proc in procs:
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


def last_heartbeat(log_text: str, who: str = "the pod") -> Heartbeat:
    """The heartbeat a pod's entrypoint prints last (`last heartbeat {...}`)."""
    found = LAST_HEARTBEAT.findall(log_text)
    assert found, f"{who}: no final heartbeat in its log:\n{log_text[-6000:]}"
    return Heartbeat.model_validate_json(found[-1])
