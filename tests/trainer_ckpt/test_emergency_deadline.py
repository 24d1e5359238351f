"""An emergency save that fits the pod's grace period: a rank stopped by SIGTERM (a real process,
real files, `stop_saver.py`) with the deadline the entrypoint writes returns from its save by the
deadline and exits before the launcher's SIGKILL would come. When the persist cannot finish in
time, the step is still committed in memory (and at the peer), the rank says so, and the cut
persist is a partial that no resume loads; when it fits, the step is persisted too."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from ckpt_saver import State, content_hash, expected_hash
from rtj.contract import ExitCode
from rtj_trainer.checkpoint import SOURCE_LOCAL, SOURCE_PERSISTENT, CheckpointManager, latest_committed
from rtj_trainer.checkpoint_format import stale_entries
from rtj_trainer.peer_replica import ReplicaServer, held_replicas
from rtj_trainer.runtime_env import GRACEFUL_STOP_EXIT_MARGIN_S, write_graceful_stop
from stop_saver import MEMORY_INTERVAL

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

#: 4 MiB of state at 0.5 MiB/s: a persist takes about 8 s, far past the short grace below.
THROTTLED = 1 << 19


@dataclass
class Stopped:
    rc: int
    exited: float  # time.time() once the rank had exited
    deadline: float
    record: dict[str, Any]


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[ReplicaServer]:
    """The peer pod's replica server."""
    server = ReplicaServer(str(tmp_path / "peer"), host="127.0.0.1").start()
    yield server
    server.stop()


def _stop_rank(tmp_path: Path, write_bytes_per_s: int, grace_s: float, peer: ReplicaServer) -> Stopped:
    status = tmp_path / "status"
    status.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("stop_saver.py")), str(status),
         str(tmp_path / "persist"), str(tmp_path / "shm"), str(write_bytes_per_s), f"127.0.0.1:{peer.port}"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + grace_s
        write_graceful_stop(str(status), deadline)  # what the entrypoint does before forwarding
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        exited = time.time()
    finally:
        proc.kill()
    (record,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert record["event"] == "stopped", record
    return Stopped(proc.returncode, exited, deadline, record)


def _load(tmp_path: Path) -> tuple[int | None, str | None, str | None]:
    """What a restarted rank of this pod resumes from: (step, source, whether its state is right)."""
    mgr = CheckpointManager(
        str(tmp_path / "persist"),
        rank=0,
        world_size=1,
        interval_steps=1_000_000,
        local_root=str(tmp_path / "shm"),
        local_interval_steps=MEMORY_INTERVAL,
    )
    state = State()
    resumed = mgr.load_latest(state)
    if resumed is None:
        return None, None, None
    return resumed.step, resumed.source, content_hash(state)


def test_a_persist_longer_than_the_grace_leaves_the_step_in_memory_and_at_the_peer(
    tmp_path: Path, peer: ReplicaServer
) -> None:
    stopped = _stop_rank(tmp_path, THROTTLED, grace_s=2.5, peer=peer)
    rec, step = stopped.record, stopped.record["step"]
    # Back from the save by the deadline, and gone before the launcher's SIGKILL would come.
    assert stopped.rc == ExitCode.TERMINATED
    assert rec["t"] <= stopped.deadline, rec
    assert stopped.exited <= stopped.deadline + GRACEFUL_STOP_EXIT_MARGIN_S
    assert (rec["memory"], rec["replica"], rec["persisted"]) == (True, True, False), rec
    assert rec["seconds_left"] >= 0, rec
    # The persist was cut: a partial of that step, nothing committed ...
    persist = str(tmp_path / "persist")
    (partial,) = stale_entries(persist)
    assert os.path.basename(partial).startswith(f"step-{step:010d}.") and partial.endswith(".partial")
    assert latest_committed(persist) is None
    # ... the peer holds the step's replica ...
    assert step in {s for s, _ in held_replicas(str(tmp_path / "peer")).get(0, [])}
    # ... and the pod's memory snapshot of the step is what a restart in this pod loads.
    assert _load(tmp_path) == (step, SOURCE_LOCAL, expected_hash(step))
    # A new pod (its memory gone): the partial is never loaded.
    shutil.rmtree(tmp_path / "shm")
    assert _load(tmp_path) == (None, None, None)


def test_a_persist_that_fits_the_grace_persists_the_step(tmp_path: Path, peer: ReplicaServer) -> None:
    stopped = _stop_rank(tmp_path, 0, grace_s=20.0, peer=peer)
    rec, step = stopped.record, stopped.record["step"]
    assert stopped.rc == ExitCode.TERMINATED
    assert (rec["memory"], rec["replica"], rec["persisted"]) == (True, True, True), rec
    assert latest_committed(str(tmp_path / "persist")) == step
    shutil.rmtree(tmp_path / "shm")  # a new pod: the persisted step is what it loads
    assert _load(tmp_path) == (step, SOURCE_PERSISTENT, expected_hash(step))
