"""The memory tier of rtj_trainer.checkpoint in one process, real files: a persist slower than the
interval never holds up memory snapshots nor adds any, and the resume takes the newest readable
tier."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from ckpt_saver import State, content_hash, expected_hash
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint import CheckpointManager, latest_committed, snapshot_ring
from rtj_trainer.checkpoint.memory_tier import SPARE_PREFIX
from rtj_trainer.checkpoint.staging import Snapshot
from rtj_trainer.checkpoint_format import local_rank_dir, local_snapshots

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

MEMORY_INTERVAL, PERSIST_INTERVAL = 5, 10


def _manager(tmp_path: Path, **kw: object) -> CheckpointManager:
    return CheckpointManager(
        str(tmp_path / "persist"),
        rank=0,
        world_size=1,
        interval_steps=PERSIST_INTERVAL,
        local_root=str(tmp_path / "shm"),
        local_interval_steps=MEMORY_INTERVAL,
        **kw,  # type: ignore[arg-type]
    )


def test_a_slow_persist_neither_holds_up_nor_multiplies_memory_snapshots(tmp_path: Path) -> None:
    # 4 MiB at 1 MiB/s: one persist drains for ~4 s, the steps below take ~20 ms each.
    mgr = _manager(tmp_path, write_bytes_per_s=1 << 20)
    state = State()
    outcomes: dict[int, str] = {}
    local_steps: set[int] = set()
    for step in range(1, 61):
        state.fill(step)
        outcomes[step] = mgr.maybe_save(step, state)
        if mgr.wait_local(timeout=5) and mgr.last_local is not None:  # commits within a step or so
            local_steps.add(mgr.last_local)
        time.sleep(0.02)
    assert mgr.wait(timeout=60)
    kinds = Counter(outcomes.values())
    # Every memory interval got its snapshot although persists were draining all along ...
    assert set(range(MEMORY_INTERVAL, 61, MEMORY_INTERVAL)) <= local_steps, sorted(local_steps)
    # ... a draining persist added no memory-only snapshot (a coalesced persist snapshots its step) ...
    assert all(s % MEMORY_INTERVAL == 0 for s, o in outcomes.items() if o == "snapshot"), outcomes
    # ... and persists were coalesced, not queued.
    assert 1 <= kinds["saved"] < 60 // PERSIST_INTERVAL, kinds
    assert latest_committed(str(tmp_path / "persist")) is not None


def test_resume_takes_the_newest_tier_every_rank_can_read(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    state = State()
    for step in range(1, 24):  # memory snapshots at 5..20, persisted at 10 and 20
        state.fill(step)
        mgr.maybe_save(step, state)
        assert mgr.wait(timeout=30)
    fresh = State()
    resumed = _manager(tmp_path).load_latest(fresh)
    assert resumed is not None and (resumed.step, resumed.source) == (20, "local")
    assert content_hash(fresh) == expected_hash(20)
    # The pod is replaced: memory is gone, the persisted step 20 remains.
    rank_dir = local_rank_dir(str(tmp_path / "shm"), 0)
    for s, n in local_snapshots(rank_dir):
        (Path(rank_dir) / f"step-{s:010d}.{n:x}" / "snapshot.json").unlink()
    fresh = State()
    resumed = _manager(tmp_path).load_latest(fresh)
    assert resumed is not None and (resumed.step, resumed.source) == (20, "persistent")
    assert content_hash(fresh) == expected_hash(20)


def _snapshot_bytes(tmp_path: Path, step: int) -> bytes:
    rank_dir = Path(local_rank_dir(str(tmp_path / "shm"), 0))
    (snap,) = [p for p in rank_dir.iterdir() if p.name.startswith(f"step-{step:010d}.")]
    return (snap / "rank-00000.bin").read_bytes()


def test_threaded_snapshot_writes_the_same_bytes_and_reports_its_seconds(tmp_path: Path) -> None:
    """The memory tier's write from the pinned buffer, split over threads: the same file, byte for
    byte, as one writer, also when it recycles an older snapshot's file in place; each snapshot
    event carries the seconds its write took."""
    written: dict[int, bytes] = {}
    for threads in (1, 4):
        events = []
        work = tmp_path / f"t{threads}"
        mgr = _manager(work, local_write_threads=threads, local_keep=1, on_event=events.append)
        state = State()
        for step in range(1, 16):  # memory snapshots at 5, 10 (recycling 5's file), 15
            state.fill(step)
            mgr.maybe_save(step, state)
            assert mgr.wait_local(timeout=30)
        snaps = [e for e in events if e.kind == "snapshot"]
        assert [e.step for e in snaps] == [5, 10, 15]
        assert all(e.seconds is not None and e.seconds > 0 for e in snaps)
        assert mgr.wait(timeout=30)
        written[threads] = _snapshot_bytes(work, 15)
        fresh = State()
        resumed = _manager(work).load_latest(fresh)
        assert resumed is not None and (resumed.step, resumed.source) == (15, "local")
        assert content_hash(fresh) == expected_hash(15)
    assert written[4] == written[1]


def test_more_write_threads_than_chunks_and_empty_tensors_are_fine(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, local_write_threads=64)
    state = State()
    state.register_buffer("empty", torch.zeros(0))
    state.fill(5)
    assert mgr.maybe_save(5, state) == "snapshot"
    assert mgr.wait(timeout=30)
    fresh = State()
    fresh.register_buffer("empty", torch.zeros(0))
    resumed = _manager(tmp_path).load_latest(fresh)
    assert resumed is not None and resumed.step == 5 and content_hash(fresh) == content_hash(state)


def test_a_write_slower_than_the_interval_widens_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~1 ms steps, interval 5, and a snapshot whose copy takes 50 ms (a device-to-host copy slower
    than the interval, played by our own Snapshot.wait_copied): a snapshot spans many intervals.
    Once one was measured, the ranks agree on a wider interval, a multiple of the configured one
    that the snapshot fits in (rtj_trainer.checkpoint.snapshot_every), so a due snapshot need not
    wait for the last."""
    copied = Snapshot.wait_copied
    monkeypatch.setattr(Snapshot, "wait_copied", lambda snap: (time.sleep(0.05), copied(snap))[1])
    mgr = _manager(tmp_path, adapt_local_interval=True)
    state = State()
    state.register_buffer("big", torch.zeros(1 << 20))
    assert mgr.local_every == MEMORY_INTERVAL
    for step in range(1, 20_001):
        mgr.maybe_save(step, state)
        time.sleep(0.001)
        if mgr.saves_started >= 3:  # a later save than the first write's end: agreed on its seconds
            break
    assert mgr.wait(timeout=60)
    print(f"local_every {mgr.local_every}, write {mgr._last_write_s:.4f} s, step {mgr._step_s:.5f} s")
    assert mgr.local_every > MEMORY_INTERVAL and mgr.local_every % MEMORY_INTERVAL == 0, mgr.local_every


def test_a_restarted_rank_keeps_every_committed_snapshot_until_its_next_write(tmp_path: Path) -> None:
    """A restarted rank's manager removes only its predecessor's leftovers: a snapshot older than
    the newest `local_keep` may be the step a lost peer's replica is of (the resume's candidate);
    the next write prunes as usual."""
    mgr = _manager(tmp_path, local_keep=3)
    state = State()
    for step in range(1, 16):  # memory snapshots at 5, 10, 15
        state.fill(step)
        mgr.maybe_save(step, state)
        assert mgr.wait(timeout=30)
    rank_dir = Path(local_rank_dir(str(tmp_path / "shm"), 0))
    (rank_dir / "step-0000000020.1.partial").mkdir()  # a write the kill cut
    restarted = _manager(tmp_path, local_keep=2)
    assert [s for s, _ in local_snapshots(str(rank_dir))] == [15, 10, 5]
    assert not (rank_dir / "step-0000000020.1.partial").exists()
    state.fill(20)
    restarted.maybe_save(20, state)
    assert restarted.wait(timeout=30)
    assert [s for s, _ in local_snapshots(str(rank_dir))] == [20, 15]


def test_a_state_loaded_from_memory_does_not_change_when_the_snapshot_file_is_rewritten(
    tmp_path: Path,
) -> None:
    """A memory snapshot is loaded from the file mapped into memory (no copy on the way); what the
    rank trains on must be its own copy: later snapshots rewrite the oldest files in place."""
    torch.manual_seed(0)

    def train(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        model(torch.randn(8, 64)).square().mean().backward()
        optim.step()
        optim.zero_grad()

    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    mgr = _manager(tmp_path)
    for step in range(1, MEMORY_INTERVAL + 1):
        train(model, optim)
        mgr.maybe_save(step, model, optim)
        assert mgr.wait(timeout=30)
    want = [t.clone() for t in (*model.parameters(), *optim.state_dict()["state"][0].values())]

    model2 = torch.nn.Linear(64, 64)
    optim2 = torch.optim.AdamW(model2.parameters())  # no state yet: it is created by the load
    mgr2 = _manager(tmp_path)
    resumed = mgr2.load_latest(model2, optim2)
    assert resumed is not None and (resumed.step, resumed.source) == (MEMORY_INTERVAL, "local")
    # Other state is snapshotted by the same rank's manager until the loaded file has been reused.
    other = torch.nn.Linear(64, 64)
    other_optim = torch.optim.AdamW(other.parameters())
    rank_dir = Path(local_rank_dir(str(tmp_path / "shm"), 0))
    for step in range(MEMORY_INTERVAL + 1, 6 * MEMORY_INTERVAL + 1):
        train(other, other_optim)
        mgr2.maybe_save(step, other, other_optim)
        assert mgr2.wait(timeout=30)
    assert not [p for p in rank_dir.iterdir() if p.name.startswith(f"step-{MEMORY_INTERVAL:010d}.")]
    got = [*model2.parameters(), *optim2.state_dict()["state"][0].values()]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_preparing_again_while_a_snapshot_is_written_keeps_the_manager_busy(tmp_path: Path) -> None:
    """An in-process restart re-enters the training loop, which prepares the host buffers again.
    While the previous snapshot is still being committed the manager must stay busy: a save let
    through would refill the slot under the writer and commit a mix of two steps. The commit is
    held (our own method, wrapped) so that the test sees the writer at work."""
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])  # 128 MB of weights
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 2048)).sum().backward()
    optim.step()
    mgr = _manager(tmp_path)
    mgr.prepare(model, optim)
    assert mgr.wait_local(timeout=60)
    memory = mgr._p.memory
    release = threading.Event()
    commit = memory.commit
    memory.commit = lambda snap: (release.wait(30), commit(snap))[1]
    assert mgr.maybe_save(MEMORY_INTERVAL, model, optim) == "snapshot"
    mgr.prepare(model, optim)  # the re-entered loop
    assert mgr._preparer is not None
    mgr._preparer.join(30)  # every slot mapped already: done at once
    assert mgr._writer is not None and mgr._writer.is_alive()
    assert mgr.busy
    assert mgr.maybe_save(2 * MEMORY_INTERVAL, model, optim) == "skipped"
    release.set()
    assert mgr.wait(timeout=60)
    assert mgr.last_local == MEMORY_INTERVAL


def test_snapshots_land_in_ring_files_prepared_once(tmp_path: Path) -> None:
    """With the ring (rtj_trainer.checkpoint.snapshot_ring), `prepare` makes keep + 1 slot files
    and every later snapshot is copied into one of them: no file created per snapshot, the newest
    loads back bit for bit, and a slot that is not kept becomes a spare, not a deleted file."""
    mgr = _manager(tmp_path, local_keep=2)
    state = State()
    state.fill(1)
    mgr.prepare(state)
    assert mgr.wait_local(timeout=60)
    rank_dir = Path(local_rank_dir(str(tmp_path / "shm"), 0))

    def slot_inodes() -> set[int]:
        return {f.stat().st_ino for f in rank_dir.glob("*/rank-00000.bin")}

    prepared = slot_inodes()
    assert len(prepared) == 3, sorted(p.name for p in rank_dir.iterdir())
    for step in range(MEMORY_INTERVAL, 9 * MEMORY_INTERVAL + 1, MEMORY_INTERVAL):
        state.fill(step)
        assert mgr.maybe_save(step, state) in ("snapshot", "saved")
        # The persist too: a snapshot still being persisted when the next one prunes is protected
        # and kept until the prune after that (CI once saw [45, 40, 35] below).
        assert mgr.wait(timeout=30)
        assert slot_inodes() <= prepared
    assert [s for s, _n in local_snapshots(str(rank_dir))] == [45, 40]
    assert len(slot_inodes()) == 3  # the third slot is a spare again
    fresh = State()
    resumed = _manager(tmp_path, local_keep=2).load_latest(fresh)
    assert resumed is not None and (resumed.step, resumed.source) == (45, "local")
    assert content_hash(fresh) == expected_hash(45)


def test_the_first_snapshot_waits_for_its_own_slot_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`prepare` readies the ring's slots side by side and counts them ready in the order claims
    take them: the first snapshot goes ahead once its own slot is ready, while the next ones are
    still being prepared, and a snapshot whose slot is not ready yet waits (the manager busy) rather
    than have the training thread reserve it, even when a later slot is ready. The second slot's
    preparation is held (our own wrapper of the reserve, `snapshot_ring.reserve_pages`)."""
    release, reserves = threading.Event(), []
    reserve = snapshot_ring.reserve_pages

    def held(fd: int, *args: object, **kw: object) -> int:
        path = os.readlink(f"/proc/self/fd/{fd}")
        reserves.append(path)
        if f"{SPARE_PREFIX}1" in path:
            release.wait(60)
        return reserve(fd, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(snapshot_ring, "reserve_pages", held)
    mgr = _manager(tmp_path, local_keep=2)
    state = State()
    state.fill(MEMORY_INTERVAL)
    mgr.prepare(state)
    wait_for(lambda: not mgr.preparing, timeout=60, interval=0.01, message="the first slot ready")
    assert mgr._preparer is not None and mgr._preparer.is_alive()
    assert mgr.maybe_save(MEMORY_INTERVAL, state) == "snapshot"
    wait_for(lambda: not mgr._p.writer.busy, timeout=60, interval=0.01, message="the first snapshot written")
    assert mgr.busy  # the second slot is still held
    assert mgr.maybe_save(2 * MEMORY_INTERVAL, state) == "skipped"
    release.set()
    assert mgr.wait_local(timeout=60) and len(reserves) == 3  # keep + 1 slots
    state.fill(3 * MEMORY_INTERVAL)
    assert mgr.maybe_save(3 * MEMORY_INTERVAL, state) in ("snapshot", "saved")  # and the deferred persist
    assert mgr.wait(timeout=60)
    assert [s for s, _n in local_snapshots(local_rank_dir(str(tmp_path / "shm"), 0))] == [
        3 * MEMORY_INTERVAL,
        MEMORY_INTERVAL,
    ]
    fresh = State()
    resumed = _manager(tmp_path, local_keep=2).load_latest(fresh)
    assert resumed is not None and (resumed.step, resumed.source) == (3 * MEMORY_INTERVAL, "local")
    assert content_hash(fresh) == expected_hash(3 * MEMORY_INTERVAL)
