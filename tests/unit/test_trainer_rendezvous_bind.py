"""The rendezvous host waits for its port instead of crash-looping while a predecessor holds it, and
runs NVRx's own store host (`nvrx-control`) for the job."""

from __future__ import annotations

import socket
import threading

import pytest
from rtj import contract
from rtj_trainer import rendezvous_host

pytestmark = pytest.mark.unit


def _config() -> contract.TrainerConfig:
    return contract.TrainerConfig.model_validate(
        {
            "jobName": "j",
            "command": ["true"],
            "args": [],
            "nnodes": 3,
            "nprocPerNode": 1,
            "rdzvEndpoint": "j-rdzv.ml.svc:29400",
            "rdzvId": "j-uid",
            "maxInJobRestarts": 0,
            "heartbeatIntervalSeconds": 1,
            "rankHangTimeoutSeconds": 5,
            "rankInitialTimeoutSeconds": 5,
            "inProcess": {
                "enabled": True,
                "softTimeoutSeconds": 60,
                "hardTimeoutSeconds": 90,
                "maxRestarts": 10,
            },
            "checkpointDir": "/tmp",
            "checkpointIntervalSteps": 1,
            "checkpointsToKeep": 2,
            "maxNoProgressCycles": 3,
            "doNotRestartExitCodes": [93, 78],
        }
    )


def test_waits_until_the_predecessor_releases_the_port() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    stop, result = threading.Event(), []
    waiter = threading.Thread(
        target=lambda: result.append(rendezvous_host.wait_for_free_port("127.0.0.1", port, stop, timeout=30))
    )
    waiter.start()
    waiter.join(2.0)
    assert waiter.is_alive(), "must keep waiting while the port is taken"
    holder.close()
    waiter.join(10)
    assert result == [True]


def test_gives_up_when_stopped_or_out_of_time() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not rendezvous_host.wait_for_free_port("127.0.0.1", port, threading.Event(), timeout=0.5)
        stop = threading.Event()
        stop.set()
        assert not rendezvous_host.wait_for_free_port("127.0.0.1", port, stop, timeout=30)


def test_control_plane_hosts_the_jobs_rendezvous() -> None:
    cmd = rendezvous_host.control_plane_command(_config(), host="0.0.0.0", port=29400)
    assert cmd[1:3] == ["-m", "rtj_trainer.rendezvous_host"]  # NVRx's control plane, polling faster
    for flag in ("--nnodes=3", "--rdzv-backend=c10d", "--rdzv-endpoint=0.0.0.0:29400", "--rdzv-id=j-uid"):
        assert flag in cmd, flag
