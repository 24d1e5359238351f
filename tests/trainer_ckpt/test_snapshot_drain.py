"""The parts of the memory tier's GPU path (rtj_trainer.checkpoint.device_stage) that run without a
GPU, on real files: a snapshot whose drain into host memory fails is never written anywhere (no
memory snapshot committed, no persist from half-filled buffers); a slot's pages are populated
without changing its bytes; a claimed slot is handed out as flat bytes, and private bytes when no
slot can be had. The GPU half's logic (staging into the flat buffer, the chunk ring both ways, the
room check, the manager's staged path) runs here on the CPU through `host_device.HostOps`, a
synchronous stand-in for `device_stage.CudaOps`; its speed and its CUDA streams are measured by
bench/snapshot_paths.py and the GPU smoke."""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from host_device import HostOps, stage_on_host
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint import CheckpointManager, latest_committed
from rtj_trainer.checkpoint.device_stage import (
    HEADROOM_BYTES,
    ChunkPipe,
    DeviceStage,
    copy_bytes,
    entry_views,
)
from rtj_trainer.checkpoint.snapshot_ring import layout, populate
from rtj_trainer.checkpoint.staging import Snapshot
from rtj_trainer.checkpoint_format import LOCAL_META, CheckpointError, local_rank_dir, local_snapshots
from rtj_trainer.slot_copier import reserve_pages
from tmpfs import mounted_tmpfs

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]


def _manager(tmp_path: Path, persist_every: int = 5) -> CheckpointManager:
    return CheckpointManager(
        str(tmp_path / "persist"), rank=0, world_size=1, interval_steps=persist_every,
        local_root=str(tmp_path / "shm"), local_interval_steps=5,
    )  # fmt: skip


def _train(model: torch.nn.Linear, optim: torch.optim.Optimizer) -> None:
    model(torch.randn(8, model.in_features)).square().mean().backward()
    optim.step()
    optim.zero_grad()


def _prepare(mgr: CheckpointManager, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    mgr.prepare(model, optim)
    wait_for(lambda: not mgr.preparing, timeout=30, interval=0.01, message="the host buffers prepared")


def _state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [*model.parameters(), *optim.state_dict()["state"][0].values()]


def test_a_failed_drain_is_raised_again_and_never_run_twice() -> None:
    calls = []

    def drain() -> None:
        calls.append(1)
        raise RuntimeError("CUDA error: an illegal memory access")

    snap = Snapshot(5, 1, {}, [torch.zeros(4)], None)
    snap.drain = drain
    for _ in range(2):
        with pytest.raises(RuntimeError, match="illegal memory access"):
            snap.wait_copied()
    assert calls == [1]


def test_a_snapshot_whose_drain_fails_is_neither_committed_nor_persisted(tmp_path: Path) -> None:
    mgr = _manager(tmp_path)
    faults: list[str] = []
    mgr._p.events.fault = lambda step, reason, message: faults.append(reason)  # type: ignore[method-assign]
    staging = mgr._p.staging
    plain = staging.copy_to_host

    def failing(tensors, optimizer):  # type: ignore[no-untyped-def]
        host, ready, _ = plain(tensors, optimizer)

        def drain() -> None:
            raise RuntimeError("drain failed")

        return host, ready, drain

    staging.copy_to_host = failing  # type: ignore[method-assign]
    w = torch.nn.Linear(4, 4)
    assert mgr.maybe_save(5, w) == "saved"  # a memory snapshot, persisted too (step 5 % 5)
    assert mgr.wait(timeout=30)
    assert faults == ["MemorySnapshotFailed"]
    assert local_snapshots(local_rank_dir(str(tmp_path / "shm"), 0)) == []
    assert latest_committed(str(tmp_path / "persist")) is None  # not written from the buffers
    staging.copy_to_host = plain  # type: ignore[method-assign]
    assert mgr.maybe_save(10, w) == "saved"
    assert mgr.wait(timeout=30)
    assert latest_committed(str(tmp_path / "persist")) == 10


def test_populate_maps_a_slot_without_changing_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "slot.bin"
    data = os.urandom(3 * 4096 + 100)
    path.write_bytes(data)
    mapped = torch.from_file(str(path), shared=True, size=len(data), dtype=torch.uint8)
    populate(mapped)
    del mapped
    assert path.read_bytes() == data


def _resident_bytes(t: torch.Tensor) -> int:
    """Bytes of the mapping that starts at `t`'s data, present in this process (/proc/self/smaps)."""
    start = f"{t.data_ptr():x}-"
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip("0").startswith(start.lstrip("0")))
    rss = next(line for line in lines[at + 1 :] if line.startswith("Rss:"))
    return int(rss.split()[1]) * 1024


def test_populate_in_chunks_makes_every_page_of_a_slot_present(tmp_path: Path) -> None:
    page = mmap.PAGESIZE
    size = 10 * page + 5 * page // 2  # three chunks of four pages and a short one, ending mid-page
    path = tmp_path / "slot.bin"
    path.write_bytes(bytes(size))
    mapped = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
    before = _resident_bytes(mapped)
    populate(mapped, chunk_bytes=4 * page)
    assert before < size
    assert _resident_bytes(mapped) == -(-size // page) * page


def test_reserve_pages_reserves_a_sparse_slot_piece_by_piece_and_makes_every_page_present(
    tmp_path: Path,
) -> None:
    """What `prepare` runs for each slot (in the copier, or the rank): the file's space allocated
    (posix_fallocate, piece by piece) and its pages present, pieces and threads of any size."""
    page = mmap.PAGESIZE
    size = 13 * page + page // 3  # pieces of five pages, each split over two threads, a short last
    path = tmp_path / "slot.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, size)
        assert os.fstat(fd).st_blocks == 0  # sparse: nothing reserved yet
        mapped = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
        with ThreadPoolExecutor(3) as pool:
            addr = mapped.data_ptr()
            present = reserve_pages(fd, addr, size, pool.submit, 2, piece=5 * page, chunk_bytes=page)
        assert present == size
        assert os.fstat(fd).st_blocks * 512 >= size
        assert _resident_bytes(mapped) == -(-size // page) * page
    finally:
        os.close(fd)


def test_reserve_pages_on_a_full_tmpfs_raises_enospc_rather_than_leave_a_hole(tmp_path: Path) -> None:
    """A slot larger than its tmpfs's free space is an OSError (ENOSPC) from `reserve_pages`, never
    a slot with holes a later copy would fault on (SIGBUS)."""
    page = mmap.PAGESIZE
    size = (12 << 20) // page * page
    with mounted_tmpfs(tmp_path / "tiny", "8m") as mnt:
        fd = os.open(mnt / "slot.bin", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            mapped = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
            with ThreadPoolExecutor(2) as pool, pytest.raises(OSError) as raised:
                reserve_pages(fd, mapped.data_ptr(), size, pool.submit, 2, piece=2 << 20, chunk_bytes=1 << 20)
            assert raised.value.errno == errno.ENOSPC
            del mapped
        finally:
            os.close(fd)


def test_a_claimed_slot_is_handed_out_as_flat_bytes_or_private_ones_when_none_can_be_had(
    tmp_path: Path,
) -> None:
    mgr = _manager(tmp_path)
    ring = mgr._p.ring
    assert ring is not None
    specs = [torch.zeros(3, 5), torch.zeros(7, dtype=torch.float64)]
    entries, size = layout(specs)
    ring.claim(5, 1)
    whole, views = ring.flat(specs)
    assert whole.numel() == size and ring.partial is not None and ring.partial.endswith(".partial")
    views[1].fill_(2.5)
    assert torch.equal(
        whole[entries[1].offset : entries[1].offset + 56].view(torch.float64), torch.full((7,), 2.5)
    )
    assert os.path.getsize(os.path.join(ring.partial, "rank-00000.bin")) == size  # the slot's own file
    mgr._p.memory.claim = lambda step, nonce: (_ for _ in ()).throw(OSError(28, "No space left on device"))  # type: ignore[union-attr,method-assign]
    faults: list[str] = []
    mgr._p.events.fault = lambda step, reason, message: faults.append(message)  # type: ignore[method-assign]
    ring.claim(10, 2)
    private, views = ring.flat(specs)
    assert ring.partial is None and private.numel() == size and not private.is_shared()
    assert [tuple(v.shape) for v in views] == [(3, 5), (7,)]
    assert len(faults) == 1 and "no memory-tier slot for step 10" in faults[0]


def _mapped(path: Path, size: int) -> torch.Tensor:
    with open(path, "wb") as f:
        f.truncate(size)
    return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_chunk_pipe_carries_every_byte_both_ways_whatever_the_chunking(
    tmp_path: Path, threads: int
) -> None:
    chunk = 64 << 10
    # Fewer bytes than a chunk, exactly the ring, and more than two rings with a partial last chunk.
    for n in (1000, 3 * chunk, 7 * chunk + 4097):
        pipe = ChunkPipe(0, threads, chunk_bytes=chunk, depth=3, ops=HostOps(), load_threads=threads)
        src = torch.randint(0, 256, (n,), dtype=torch.uint8)
        dst = _mapped(tmp_path / f"slot-{n}.bin", n)
        assert pipe.last_drain is None
        pipe.to_host(src, dst)
        assert torch.equal(dst, src)
        assert pipe.last_drain is not None and min(pipe.last_drain) >= 0.0  # (GPU wait, host copy) s
        back = torch.zeros(n, dtype=torch.uint8)
        pipe.to_device(dst, back)
        assert torch.equal(back, src)
        pipe.close()
        assert (tmp_path / f"slot-{n}.bin").read_bytes() == src.numpy().tobytes()


def test_copy_bytes_copies_every_byte_and_leaves_what_it_cannot_memmove_to_torch() -> None:
    src = torch.randint(-(2**31), 2**31 - 1, (3, 1000), dtype=torch.int32)
    dst = torch.zeros_like(src)
    copy_bytes(dst, src)  # contiguous, one size: one memmove
    assert torch.equal(dst, src)
    flat = torch.zeros(src.numel() * 4, dtype=torch.uint8)
    copy_bytes(flat, src.view(torch.uint8).reshape(-1))  # bytes into a mapped-file-like flat buffer
    assert torch.equal(flat.view(torch.int32).reshape(3, 1000), src)
    strided = torch.zeros(1000, 3, dtype=torch.int32).t()  # not contiguous: torch's copy_
    copy_bytes(strided, src)
    assert torch.equal(strided, src)
    wider = torch.zeros(3, 1000, dtype=torch.int64)  # another size in bytes: torch's copy_ converts
    copy_bytes(wider, src)
    assert torch.equal(wider, src.to(torch.int64))
    copy_bytes(torch.empty(0), torch.empty(0))


def test_a_staged_snapshot_lands_in_the_slot_file_as_staged_and_loads_back(tmp_path: Path) -> None:
    ops = HostOps()
    state = [
        torch.randn(33, 17),
        torch.randn(1000).to(torch.bfloat16),
        torch.tensor(7, dtype=torch.int64),  # a step count: shape ()
        torch.zeros(0),
        torch.randn(5, 3, dtype=torch.float64).t(),  # not contiguous
    ]
    entries, size = layout(state)
    stage = DeviceStage(threads=2, ops=ops)
    stage._pipe(0).chunk_bytes = 4096  # many chunks for a small state
    assert stage.prepare(size, 0) and stage.size() == size
    staged_in, _start, staged = stage.stage(state, entries)
    expected = [t.clone() for t in state]
    for t in state:  # training goes on: the snapshot keeps what was staged
        t.add_(1) if t.dtype != torch.int64 else t.fill_(8)
    slot = _mapped(tmp_path / "rank-00000.bin", size)
    stage.drain(staged_in, slot, staged)
    del slot
    slot = torch.from_file(str(tmp_path / "rank-00000.bin"), shared=True, size=size, dtype=torch.uint8)
    on_file = entry_views(slot, entries)
    assert all(torch.equal(a, b) for a, b in zip(on_file, expected, strict=True))
    loaded = stage.load(slot, 0)
    assert loaded is not None and loaded.data_ptr() != staged_in.data_ptr()
    assert all(torch.equal(a, b) for a, b in zip(entry_views(loaded, entries), expected, strict=True))


def test_no_staging_buffer_where_the_gpu_lacks_room_for_it_and_its_headroom() -> None:
    size = 1 << 20
    stage = DeviceStage(threads=1, ops=HostOps(free=size + HEADROOM_BYTES - 1))
    assert not stage.prepare(size, 0) and stage.flat is None and stage.size() == -1
    assert stage.load(torch.zeros(size, dtype=torch.uint8), 0) is None
    roomy = DeviceStage(threads=1, ops=HostOps(free=size + HEADROOM_BYTES))
    assert roomy.prepare(size, 0)
    flat = roomy.flat
    assert roomy.prepare(size, 0) and roomy.flat is flat  # kept while the layout's size holds
    assert roomy.prepare(size - 4096, 0) and roomy.flat is not flat  # a new layout: a new buffer
    assert not roomy.prepare(size + 4096, 0) and roomy.flat is None  # no room for it: pinned path


def test_the_manager_stages_drains_commits_and_resumes_through_the_device_stage(tmp_path: Path) -> None:
    """The whole memory-tier path of a GPU rank with staging on (`CheckpointManager` → `HostStaging`
    → `DeviceStage` → the slot file → a restarted rank's `load_latest` through the stage), on the
    CPU stand-in: the resumed state is the snapshot's, bit for bit, scalars kept on the host too."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    mgr, ops = _manager(tmp_path), HostOps()
    stage = stage_on_host(mgr, ops)
    _train(model, optim)
    _prepare(mgr, model, optim)
    assert stage.flat is not None and ops.calls["buffer"] == 1 and ops.calls["set_device"] == 1
    drains: list[int] = []
    drain = stage.drain
    stage.drain = lambda *a: (drains.append(1), drain(*a))[1]  # type: ignore[method-assign,func-returns-value]
    for step in range(2, 6):
        _train(model, optim)
        mgr.maybe_save(step, model, optim)
        assert mgr.wait(timeout=30)
    assert drains == [1]  # the step-5 snapshot went through the stage
    assert mgr.last_drain is not None and mgr.last_drain[1] > 0.0  # its split, for the step log
    want = [t.clone() for t in _state(model, optim)]
    _train(model, optim)  # the live state moves on

    model2 = torch.nn.Linear(64, 64)
    optim2 = torch.optim.AdamW(model2.parameters())
    mgr2, ops2 = _manager(tmp_path), HostOps()
    stage_on_host(mgr2, ops2)
    resumed = mgr2.load_latest(model2, optim2)
    assert resumed is not None and (resumed.step, resumed.source) == (5, "local")
    assert ops2.calls["buffer"] == 1 and ops2.calls["release"] == 1  # loaded through a buffer, then freed
    got = _state(model2, optim2)
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert optim2.state_dict()["state"][0]["step"].item() == 5


def _snapshots_at_5_and_10(tmp_path: Path) -> dict[int, list[torch.Tensor]]:
    """Memory snapshots of steps 5 and 10 in the tier (by the host path; nothing persisted); each
    step's state."""
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    mgr, states = _manager(tmp_path, persist_every=1000), {}
    for step in range(1, 11):
        _train(model, optim)
        if mgr.maybe_save(step, model, optim):
            assert mgr.wait(timeout=30)
            states[step] = [t.clone() for t in _state(model, optim)]
    mgr.close()
    assert sorted(states) == [5, 10]
    return states


def _restarted_rank(tmp_path: Path) -> tuple[CheckpointManager, DeviceStage, list[str]]:
    """A new rank process's manager on the stand-in GPU; the threads that allocate device buffers."""
    mgr, ops = _manager(tmp_path), HostOps()
    stage = stage_on_host(mgr, ops)
    allocated_in: list[str] = []
    buffer = ops.buffer
    ops.buffer = lambda n, d: (allocated_in.append(threading.current_thread().name), buffer(n, d))[1]  # type: ignore[method-assign]
    return mgr, stage, allocated_in


def _resume(mgr: CheckpointManager) -> tuple[int, list[torch.Tensor]]:
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    resumed = mgr.load_latest(model, optim)
    assert resumed is not None and resumed.source == "local"
    return resumed.step, _state(model, optim)


def test_a_restarted_rank_resumes_from_the_snapshot_it_prefetched_to_the_gpu(tmp_path: Path) -> None:
    """A new rank process begins its newest snapshot's way to the GPU before its process group is
    up (`prefetch_memory_snapshot`); the resume takes that buffer instead of loading again."""
    want = _snapshots_at_5_and_10(tmp_path)
    mgr, stage, allocated_in = _restarted_rank(tmp_path)
    prefetched = mgr.prefetch_memory_snapshot(0)
    assert prefetched is not None and prefetched[0] == 10
    step, got = _resume(mgr)
    assert step == 10 and all(torch.equal(g, w) for g, w in zip(got, want[10], strict=True))
    assert allocated_in == ["rtj-ckpt-prefetch"]  # the one buffer: the prefetch's
    report = mgr.prefetch_report()
    assert report is not None and (report["step"], report["used"]) == (10, True) and report["seconds"] >= 0
    assert stage.prefetched is None and stage.ops.calls["release"] == 1  # type: ignore[attr-defined]


def _prefetch_held_until_a_step(mgr: CheckpointManager, stage: DeviceStage) -> threading.Event:
    """Begin the newest snapshot's prefetch, held before its GPU buffer until the returned event is
    set (the optimizer's step hook sets it): the resume finds it still on its way."""
    stepped = threading.Event()
    buffer = stage.ops.buffer
    stage.ops.buffer = lambda n, d: (stepped.wait(30), buffer(n, d))[1]  # type: ignore[method-assign]
    assert mgr.prefetch_memory_snapshot(0) is not None
    return stepped


def test_while_the_snapshot_is_on_its_way_the_fresh_optimizer_is_warmed(tmp_path: Path) -> None:
    """The prefetch still running when the resume begins: the optimizer's state is made by torch's
    zero-gradient step in that time (`optimizer_state.warm`), its first kernels run, and the load
    then fills it; here the prefetch cannot finish before that step has begun."""
    want = _snapshots_at_5_and_10(tmp_path)
    mgr, stage, _ = _restarted_rank(tmp_path)
    stepped = _prefetch_held_until_a_step(mgr, stage)
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    optim.register_step_pre_hook(lambda *_: stepped.set())
    resumed = mgr.load_latest(model, optim)
    assert resumed is not None and (resumed.step, resumed.source) == (10, "local")
    assert "warm" in resumed.seconds and stepped.is_set(), resumed.seconds
    assert (mgr.prefetch_report() or {}).get("used") is True
    got = _state(model, optim)
    assert all(torch.equal(g, w) for g, w in zip(got, want[10], strict=True))
    assert all(p.grad is None for p in model.parameters()) and optim.param_groups[0]["lr"] == 1e-3


def test_a_warmed_optimizer_is_left_with_no_state_when_nothing_loads(tmp_path: Path) -> None:
    """Warmed while the prefetch ran, but no snapshot could be read: training starts afresh, so the
    optimizer keeps no state of the warming step (Adam would count it as a step taken)."""
    _snapshots_at_5_and_10(tmp_path)
    mgr, stage, _ = _restarted_rank(tmp_path)
    stepped = _prefetch_held_until_a_step(mgr, stage)
    memory = mgr._p.memory  # type: ignore[union-attr]

    def unreadable(step: int, nonce: int) -> None:
        raise CheckpointError(f"snapshot {step} unreadable")

    memory.read = unreadable  # type: ignore[method-assign,union-attr]
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    optim.register_step_pre_hook(lambda *_: stepped.set())
    assert mgr.load_latest(model, optim) is None
    assert stepped.is_set() and not optim.state


def test_with_nothing_on_its_way_the_optimizer_state_is_prefilled(tmp_path: Path) -> None:
    """No prefetch (or one already done): the state is made from the snapshot's layout, no step."""
    want = _snapshots_at_5_and_10(tmp_path)
    mgr, _, _ = _restarted_rank(tmp_path)
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    steps: list[int] = []
    optim.register_step_pre_hook(lambda *_: steps.append(1))
    resumed = mgr.load_latest(model, optim)
    assert resumed is not None and resumed.step == 10 and "warm" not in resumed.seconds
    assert steps == []
    assert all(torch.equal(g, w) for g, w in zip(_state(model, optim), want[10], strict=True))


def test_a_prefetched_snapshot_the_ranks_do_not_resume_from_is_given_back(tmp_path: Path) -> None:
    """The ranks agree on an older step (here: the newest is unreadable after the prefetch began):
    the prefetched buffer is given back and the agreed step loaded as without a prefetch."""
    want = _snapshots_at_5_and_10(tmp_path)
    mgr, stage, allocated_in = _restarted_rank(tmp_path)
    prefetched = mgr.prefetch_memory_snapshot(0)
    assert prefetched is not None and prefetched[0] == 10
    os.remove(os.path.join(mgr._p.memory.path(*prefetched), LOCAL_META))  # type: ignore[union-attr]
    step, got = _resume(mgr)
    assert step == 5 and all(torch.equal(g, w) for g, w in zip(got, want[5], strict=True))
    assert allocated_in == ["rtj-ckpt-prefetch", "MainThread"]
    assert (mgr.prefetch_report() or {}).get("used") is False
    assert stage.prefetched is None and stage.ops.calls["release"] == 2  # type: ignore[attr-defined]


def test_no_prefetch_without_a_snapshot_or_without_gpu_staging(tmp_path: Path) -> None:
    mgr, stage, allocated_in = _restarted_rank(tmp_path)
    assert mgr.prefetch_memory_snapshot(0) is None and stage.prefetched is None
    _snapshots_at_5_and_10(tmp_path)
    assert _manager(tmp_path).prefetch_memory_snapshot(0) is None  # no DeviceStage (no CUDA here)
    assert allocated_in == []


def test_a_prefetch_no_resume_took_is_given_back_before_a_staging_buffer_is_kept() -> None:
    ops = HostOps()
    stage = DeviceStage(threads=1, ops=ops)
    whole = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8)
    stage.prefetch(("slot", whole.numel(), 0), whole, 0)
    assert stage.prepare(4096, 0) and stage.prefetched is None
    assert ops.calls["buffer"] == 2 and ops.calls["release"] == 1


def test_out_of_gpu_memory_gives_the_staging_buffer_back_and_snapshots_go_on_without_it(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    optim = torch.optim.AdamW(model.parameters())
    mgr, ops = _manager(tmp_path), HostOps()
    stage = stage_on_host(mgr, ops)
    for prepare_again in (False, True):
        _train(model, optim)
        _prepare(mgr, model, optim)
        if not prepare_again:
            assert mgr.staged_on_device
            assert mgr.stop_gpu_staging() and stage.flat is None and ops.calls["release"] == 1
            assert not mgr.stop_gpu_staging() and not mgr.staged_on_device
    assert ops.calls["buffer"] == 1  # the second prepare kept no buffer
    drain = stage.drain
    stage.drain = lambda *a: (_ for _ in ()).throw(AssertionError("drained through the stage"))  # type: ignore[method-assign]
    for step in range(3, 6):
        _train(model, optim)
        mgr.maybe_save(step, model, optim)
        assert mgr.wait(timeout=30)
    stage.drain = drain  # type: ignore[method-assign]
    want = [t.clone() for t in _state(model, optim)]
    model2 = torch.nn.Linear(16, 16)
    optim2 = torch.optim.AdamW(model2.parameters())
    resumed = _manager(tmp_path).load_latest(model2, optim2)
    assert resumed is not None and (resumed.step, resumed.source) == (5, "local")
    got = _state(model2, optim2)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_a_rank_out_of_gpu_memory_stages_no_more_in_this_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal outlives the process (in-job and in-place restarts keep the pod's memory volume)
    and the memory tier's pruning; only a rank that held a buffer leaves it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a DeviceStage is built, not used
    mgr = _manager(tmp_path)
    assert mgr._p.staging.device is not None
    assert not mgr.stop_gpu_staging()  # no buffer held: this process only
    assert _manager(tmp_path)._p.staging.device is not None
    mgr, ops = _manager(tmp_path), HostOps()
    stage = stage_on_host(mgr, ops)
    assert stage.prepare(4096, 0)
    assert mgr.stop_gpu_staging()
    w = torch.nn.Linear(4, 4)
    for step in (5, 10, 15):  # snapshots pruned and recycled around the marker
        assert mgr.maybe_save(step, w) in ("saved", "snapshot")
        assert mgr.wait(timeout=30)
    restarted = _manager(tmp_path)
    assert restarted._p.staging.device is None and restarted._p.memory.device is None  # type: ignore[union-attr]
    assert local_snapshots(local_rank_dir(str(tmp_path / "shm"), 0))[0][0] == 15


def test_a_load_goes_through_the_gpu_only_with_room_for_the_state_it_creates_as_well() -> None:
    size = 1 << 20
    whole = torch.randint(0, 256, (size,), dtype=torch.uint8)
    assert DeviceStage(threads=1, ops=HostOps(free=2 * size + HEADROOM_BYTES - 1)).load(whole, 0) is None
    loaded = DeviceStage(threads=1, ops=HostOps(free=2 * size + HEADROOM_BYTES)).load(whole, 0)
    assert loaded is not None and torch.equal(loaded, whole)
