"""The rendezvous host waits for its port instead of crash-looping while a predecessor holds it."""

from __future__ import annotations

import socket
import threading

import pytest
from rtj import contract
from rtj_trainer import nvrx_compat

pytestmark = pytest.mark.unit


def _config() -> contract.TrainerConfig:
    return contract.TrainerConfig.model_validate(
        {
            "jobName": "j",
            "command": ["true"],
            "nnodes": 1,
            "nprocPerNode": 1,
            "rdzvEndpoint": "127.0.0.1:0",
            "rdzvId": "j",
            "maxInJobRestarts": 0,
            "heartbeatIntervalSeconds": 1,
            "rankHeartbeatTimeoutSeconds": 5,
            "rankInitialTimeoutSeconds": 5,
            "inProcess": {},
            "checkpointDir": "/tmp",
            "checkpointIntervalSteps": 1,
        }
    )


def test_rendezvous_binds_once_the_predecessor_releases_the_port() -> None:
    # The NVRx 0.4.1 path (CI's); 0.6+ hosts nvrx-control, which binds on its own.
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    stop, result = threading.Event(), []
    server = threading.Thread(
        target=lambda: result.append(
            nvrx_compat.serve_rendezvous(_config(), host="127.0.0.1", port=port, stop=stop)
        )
    )
    server.start()
    assert not stop.wait(2.0) and server.is_alive(), "must keep retrying while the port is taken"
    holder.close()

    def serving() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) == 0

    deadline = threading.Event()
    for _ in range(100):
        if serving():
            break
        deadline.wait(0.1)
    assert serving(), "the rendezvous store must be listening once the port is free"
    stop.set()
    server.join(10)
    assert result == [0]
