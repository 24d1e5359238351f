"""The parts of the memory tier's GPU path (rtj_trainer.checkpoint.device_stage) that run without a
GPU, on real files: a snapshot whose drain into host memory fails is never written anywhere (no
memory snapshot committed, no persist from half-filled buffers); a slot's pages are populated
without changing its bytes; a claimed slot is handed out as flat bytes, and private bytes when no
slot can be had. The GPU half (staging, the chunked drain and load) is measured by
bench/snapshot_paths.py and the GPU smoke."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from rtj_trainer.checkpoint import CheckpointManager, latest_committed
from rtj_trainer.checkpoint.snapshot_ring import layout, populate
from rtj_trainer.checkpoint.staging import Snapshot
from rtj_trainer.checkpoint_format import local_rank_dir, local_snapshots

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]


def _manager(tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(
        str(tmp_path / "persist"), rank=0, world_size=1, interval_steps=5,
        local_root=str(tmp_path / "shm"), local_interval_steps=5,
    )  # fmt: skip


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
