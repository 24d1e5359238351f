"""An emergency save that fits the pod's grace period (real processes, real files, `stop_saver.py`).

A rank whose own pod is stopping (SIGTERM, the entrypoint's mark) commits the step to memory (and
at the peer) and hands its persist to the pod's entrypoint (`checkpoint.handoff`), which persists
and commits it after the rank has exited, until its own deadline: a persist that does not fit is
aborted and leaves nothing a resume could load.

A rank that stops because another pod did (no signal of its own, that pod's deadline) persists in
the rank and returns from its save by the deadline, before the launcher's SIGKILL would come.
When the persist cannot finish in time, the step is still committed in memory (and at the peer),
the rank says so, and the cut persist is a partial that no resume loads; when it fits, the step is
persisted too."""

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
from rtj_trainer.checkpoint.handoff import Handoff, HandoffPersister, read_handoffs, write_handoff
from rtj_trainer.checkpoint_format import HANDOFF_UNTIL, stale_entries
from rtj_trainer.peer_replica import ReplicaServer, held_replicas
from rtj_trainer.runtime_env import GRACEFUL_STOP_EXIT_MARGIN_S, GRACEFUL_STOP_FILE, write_graceful_stop
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


def _stop_rank(
    tmp_path: Path, write_bytes_per_s: int, grace_s: float, peer: ReplicaServer, *, signalled: bool
) -> Stopped:
    """`signalled`: the rank's own pod is stopped (SIGTERM with the mark); else another pod was, and
    the rank learns of it with that pod's deadline (`stop_saver.py`'s peer stop file)."""
    status, peer_pod = tmp_path / "status", tmp_path / "peer-pod"
    status.mkdir()
    peer_pod.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("stop_saver.py")), str(status),
         str(tmp_path / "persist"), str(tmp_path / "shm"), str(write_bytes_per_s), f"127.0.0.1:{peer.port}",
         str(peer_pod / GRACEFUL_STOP_FILE)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + grace_s
        if signalled:
            write_graceful_stop(str(status), deadline)  # what the entrypoint does before forwarding
            proc.send_signal(signal.SIGTERM)
        else:
            write_graceful_stop(str(peer_pod), deadline)
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


def test_a_peer_stopped_ranks_persist_longer_than_the_grace_leaves_the_step_in_memory_and_at_the_peer(
    tmp_path: Path, peer: ReplicaServer
) -> None:
    stopped = _stop_rank(tmp_path, THROTTLED, grace_s=2.5, peer=peer, signalled=False)
    rec, step = stopped.record, stopped.record["step"]
    # Back from the save by the deadline, and gone before the launcher's SIGKILL would come.
    assert stopped.rc == ExitCode.TERMINATED
    assert rec["t"] <= stopped.deadline, rec
    assert stopped.exited <= stopped.deadline + GRACEFUL_STOP_EXIT_MARGIN_S
    tiers = (rec["memory"], rec["replica"], rec["persisted"], rec["handed_off"])
    assert tiers == (True, True, False, False), rec
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


def test_a_peer_stopped_ranks_persist_that_fits_the_grace_persists_the_step(
    tmp_path: Path, peer: ReplicaServer
) -> None:
    stopped = _stop_rank(tmp_path, 0, grace_s=20.0, peer=peer, signalled=False)
    rec, step = stopped.record, stopped.record["step"]
    assert stopped.rc == ExitCode.TERMINATED
    tiers = (rec["memory"], rec["replica"], rec["persisted"], rec["handed_off"])
    assert tiers == (True, True, True, False), rec
    assert latest_committed(str(tmp_path / "persist")) == step
    shutil.rmtree(tmp_path / "shm")  # a new pod: the persisted step is what it loads
    assert _load(tmp_path) == (step, SOURCE_PERSISTENT, expected_hash(step))


def test_a_stopping_pods_rank_hands_its_persist_to_the_entrypoint_which_commits_it(
    tmp_path: Path, peer: ReplicaServer
) -> None:
    stopped = _stop_rank(tmp_path, THROTTLED, grace_s=20.0, peer=peer, signalled=True)
    rec, step = stopped.record, stopped.record["step"]
    assert stopped.rc == ExitCode.TERMINATED
    # In memory and at the peer, not persisted by the rank (no partial of its own either) ...
    tiers = (rec["memory"], rec["replica"], rec["persisted"], rec["handed_off"])
    assert tiers == (True, True, False, True), rec
    persist = str(tmp_path / "persist")
    assert latest_committed(persist) is None and stale_entries(persist) == []
    # ... and gone long before its deadline, a record naming its snapshot of the step left behind.
    assert rec["seconds_left"] > 10, rec
    (handoff,) = read_handoffs(str(tmp_path / "status"))
    assert (handoff.rank, handoff.root, handoff.stop_deadline) == (0, persist, stopped.deadline)
    assert os.path.basename(handoff.snapshot).startswith(f"step-{step:010d}.")
    # The entrypoint's part: the step persisted and committed after the rank exited.
    persister = HandoffPersister(str(tmp_path / "status"), stopped.deadline, time.time() + 30).start()
    persister.ranks_gone()
    (done,) = persister.wait()
    assert (done.step, done.committed, done.error) == (step, True, None), done
    assert latest_committed(persist) == step and stale_entries(persist) == []
    shutil.rmtree(tmp_path / "shm")  # a new pod: the persisted step is what it loads
    assert _load(tmp_path) == (step, SOURCE_PERSISTENT, expected_hash(step))


def test_a_handed_off_persist_past_the_pods_deadline_is_dropped(tmp_path: Path, peer: ReplicaServer) -> None:
    stopped = _stop_rank(tmp_path, 0, grace_s=20.0, peer=peer, signalled=True)
    step = stopped.record["step"]
    status, persist = str(tmp_path / "status"), str(tmp_path / "persist")
    # 4 MiB at 0.5 MiB/s cannot fit in 1.5 s: aborted at the deadline, its partial removed.
    t0 = time.time()
    persister = HandoffPersister(status, stopped.deadline, t0 + 1.5, write_bytes_per_s=THROTTLED).start()
    persister.ranks_gone()
    (done,) = persister.wait()
    assert time.time() - t0 < 1.5 + 5.0
    assert (done.step, done.committed) == (step, False), done
    assert latest_committed(persist) is None and stale_entries(persist) == []
    # The step is still in the pod's memory (a restart in place loads it); a new pod has nothing.
    assert _load(tmp_path) == (step, SOURCE_LOCAL, expected_hash(step))
    shutil.rmtree(tmp_path / "shm")
    assert _load(tmp_path) == (None, None, None)


def test_the_entrypoint_takes_only_the_records_of_its_own_stop(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.mkdir()
    old = Handoff(0, 0, str(tmp_path / "shm" / "gone"), str(tmp_path / "persist"), 2, stop_deadline=1.0)
    write_handoff(str(status), old)  # a record of an earlier stop of this pod
    persister = HandoffPersister(str(status), 2.0, time.time() + 5).start()
    persister.ranks_gone()
    assert persister.wait() == []
    assert read_handoffs(str(status)) == [old]


def test_the_next_ranks_leave_a_partial_the_entrypoint_is_persisting_into(
    tmp_path: Path, peer: ReplicaServer
) -> None:
    """The job's next ranks may start on other pods while the stopped pod's entrypoint still
    persists: their rank 0's clean-up of stale partials must not remove that one before its deadline."""
    stopped = _stop_rank(tmp_path, 0, grace_s=20.0, peer=peer, signalled=True)
    step = stopped.record["step"]
    persist = str(tmp_path / "persist")
    persister = HandoffPersister(
        str(tmp_path / "status"), stopped.deadline, time.time() + 30, write_bytes_per_s=4 * THROTTLED
    ).start()  # 4 MiB at 2 MiB/s: about 2 s
    persister.ranks_gone()
    wait_until = time.monotonic() + 10
    while not (partials := [p for p in os.listdir(persist) if p.endswith(".partial")]):
        assert time.monotonic() < wait_until, "the entrypoint did not start persisting"
        time.sleep(0.01)
    (partial,) = partials
    assert stale_entries(persist) == []  # in flight, handed off: not stale
    started = CheckpointManager(persist, rank=0, world_size=1, interval_steps=1_000_000)  # rank 0 cleans up
    assert started.wait(timeout=10)  # ... in the background
    assert os.path.isdir(os.path.join(persist, partial))
    (done,) = persister.wait()
    assert (done.step, done.committed) == (step, True), done
    assert latest_committed(persist) == step
    # A partial whose entrypoint's deadline has passed is a leftover like any other.
    leftover = tmp_path / "persist" / "step-0000000001.3.partial"
    leftover.mkdir()
    (leftover / HANDOFF_UNTIL).write_text(repr(time.time() - 1))
    assert stale_entries(persist) == [str(leftover)]


@pytest.mark.parametrize("left", [True, False], ids=["left-to-the-pod", "record-not-written"])
def test_an_emergency_save_persists_in_the_rank_unless_the_pod_took_the_snapshot(
    tmp_path: Path, left: bool
) -> None:
    persist = str(tmp_path / "persist")
    mgr = CheckpointManager(
        persist, rank=0, world_size=1, interval_steps=1_000_000, local_root=str(tmp_path / "shm"),
        local_interval_steps=MEMORY_INTERVAL,
    )  # fmt: skip
    state = State()
    state.fill(7)
    offered: list[str] = []
    saved = mgr.emergency_save(7, state, timeout=30, handoff=lambda snap: offered.append(snap) or left)
    (snapshot,) = offered
    assert os.path.basename(snapshot).startswith("step-0000000007.")
    assert saved.memory and saved.handed_off == (snapshot if left else None) and saved.persisted is not left
    assert latest_committed(persist) == (None if left else 7)
    assert stale_entries(persist) == []  # nothing half-written by the rank either way
