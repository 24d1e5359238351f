"""rtj_trainer.checkpoint on one rank, real files in tmp_path: commit, resume, keep-last-k,
partials, corruption, skip/coalesce with a slow writer, world-size mismatch."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest
import torch
from rtj_trainer.checkpoint import (
    CheckpointEvent,
    CheckpointManager,
    latest_committed,
    persistent,
    snapshot_every,
)
from rtj_trainer.checkpoint_format import (
    MANIFEST,
    CheckpointError,
    committed_name,
    committed_steps,
    partial_name,
    shard_bin,
)

pytestmark = pytest.mark.unit


def _model_and_optim(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    model[2].to(torch.bfloat16)  # mixed dtypes in one checkpoint
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4, 8, generator=g)
    h = model[1](model[0](x))
    loss = model[2](h.to(torch.bfloat16)).float().pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()


def _manager(root: Path, **kw: object) -> tuple[CheckpointManager, list[CheckpointEvent]]:
    events: list[CheckpointEvent] = []
    kw.setdefault("interval_steps", 2)
    mgr = CheckpointManager(str(root), rank=0, world_size=1, on_event=events.append, **kw)  # type: ignore[arg-type]
    return mgr, events


def test_commit_and_resume_restore_model_and_optimizer_exactly(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    mgr, events = _manager(tmp_path, keep=2)
    for step in range(1, 7):
        _train_step(model, optim, step)
        mgr.maybe_save(step, model, optim, extra={"data_step": step})
        assert mgr.wait(timeout=30)
    assert [e.step for e in events if e.kind == "committed"] == [2, 4, 6]
    # Each rank measures how long writing its shard took (the operator sizes grace periods with it).
    persisted = [e for e in events if e.kind == "persisted"]
    assert [e.step for e in persisted] == [2, 4, 6]
    assert all(e.seconds is not None and 0 < e.seconds < 30 for e in persisted)
    assert committed_steps(str(tmp_path)) == [6, 4]  # keep-last-2
    assert latest_committed(str(tmp_path)) == 6

    model2, optim2 = _model_and_optim(seed=123)
    resumed = CheckpointManager(str(tmp_path), rank=0, world_size=1, interval_steps=2).load_latest(
        model2, optim2
    )
    assert resumed is not None and resumed.step == 6 and resumed.extra == {"data_step": 6}
    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b), k
    s1, s2 = optim.state_dict()["state"], optim2.state_dict()["state"]
    for i in s1:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(s1[i][key], s2[i][key]), (i, key)
    # Training continues identically from the restored state.
    _train_step(model, optim, 7)
    _train_step(model2, optim2, 7)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    _train_step(model, optim, 1)
    mgr, _ = _manager(tmp_path)
    mgr.save(2, model, optim)
    assert mgr.wait(timeout=30)
    ckpt = tmp_path / committed_name(2)
    manifest = json.loads((ckpt / MANIFEST).read_text())
    assert manifest["step"] == 2 and manifest["worldSize"] == 1
    files = manifest["ranks"]["0"]
    assert set(files) == {"rank-00000.bin", "rank-00000.idx"}
    for name, meta in files.items():
        assert (ckpt / name).stat().st_size == meta["size"]


def test_partial_and_trash_directories_are_never_loaded_and_are_cleaned(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    _train_step(model, optim, 1)
    mgr, _ = _manager(tmp_path)
    mgr.save(2, model, optim)
    assert mgr.wait(timeout=30)
    # A newer torn save (crash before the rename) and a half-deleted old one.
    torn = tmp_path / partial_name(10, 0xABC)
    torn.mkdir()
    (torn / shard_bin(0)).write_bytes(b"torn")
    trash = tmp_path / "step-0000000001.trash.999"
    trash.mkdir()
    assert latest_committed(str(tmp_path)) == 2
    # Rank 0 deletes the leftovers it finds at its start (in the background).
    started = CheckpointManager(str(tmp_path), rank=0, world_size=1, interval_steps=2)
    assert started.wait(timeout=30)
    assert not torn.exists() and not trash.exists()
    assert committed_steps(str(tmp_path)) == [2]


def test_a_starting_rank_does_not_wait_for_the_leftovers_to_be_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a killed persist's partial (the whole shard) waited on the disk in a restarting
    rank; rank 0 deletes the leftovers it finds at its start in the background."""
    torn = tmp_path / partial_name(10, 0xABC)
    torn.mkdir()
    (torn / shard_bin(0)).write_bytes(b"torn")
    deleting, release = threading.Event(), threading.Event()
    remove_tree = persistent.remove_tree

    def slow_remove_tree(path: str) -> None:
        deleting.set()
        assert release.wait(30)
        remove_tree(path)

    monkeypatch.setattr(persistent, "remove_tree", slow_remove_tree)
    mgr = CheckpointManager(str(tmp_path), rank=0, world_size=1, interval_steps=2)
    assert deleting.wait(30) and torn.exists()  # the constructor returned while the deletion waits
    later = tmp_path / partial_name(20, 0xDEF)  # written after the start: not a leftover of it
    later.mkdir()
    release.set()
    assert mgr.wait(timeout=30)
    assert not torn.exists() and later.exists()


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    mgr, _ = _manager(tmp_path, keep=3)
    snapshots = {}
    for step in (2, 4):
        _train_step(model, optim, step)
        mgr.save(step, model, optim)
        assert mgr.wait(timeout=30)
        snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    newest = tmp_path / committed_name(4) / shard_bin(0)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    newest.write_bytes(bytes(data))

    model2, optim2 = _model_and_optim(seed=5)
    loader, events = _manager(tmp_path)
    resumed = loader.load_latest(model2, optim2)
    assert resumed is not None and resumed.step == 2
    for k, v in model2.state_dict().items():
        assert torch.equal(v, snapshots[2][k])
    loader.poll()
    assert any(e.kind == "fault" and e.reason == "CheckpointUnreadable" for e in events)


def test_resume_with_another_world_size_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    _train_step(model, optim, 1)
    mgr, _ = _manager(tmp_path)
    mgr.save(2, model, optim)
    assert mgr.wait(timeout=30)
    other = CheckpointManager(str(tmp_path), rank=0, world_size=1, interval_steps=2)
    other.world_size = 4  # as if the job were resized
    with pytest.raises(CheckpointError, match="written by 1 ranks, this job has 4"):
        other.load_latest(model, optim)
    assert committed_steps(str(tmp_path)) == [2]  # nothing lost


def test_slow_writer_skips_and_coalesces_without_blocking(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    _train_step(model, optim, 1)
    # ~3.6 KB of state at 4 KB/s: each save drains for about a second.
    mgr, events = _manager(tmp_path, interval_steps=1, write_bytes_per_s=4000)
    outcomes: dict[int, str] = {}
    step = 0
    while not (step > 1 and outcomes[step] == "saved"):  # until the coalesced save starts
        step += 1
        outcomes[step] = mgr.maybe_save(step, model, optim)
        assert step < 1_000_000, "the skipped save was never coalesced"
    assert outcomes[1] == "saved"
    skipped = [s for s, o in outcomes.items() if o == "skipped"]
    assert skipped and skipped[0] == 2
    second = min(s for s, o in outcomes.items() if o == "saved" and s > 1)
    assert second > 2 and mgr.saves_skipped == len(skipped)
    assert [e.kind for e in events].count("skipped") == len(skipped)
    assert mgr.wait(timeout=30)
    assert latest_committed(str(tmp_path)) == second


def test_files_are_written_through_a_tmp_name_then_renamed(tmp_path: Path) -> None:
    model, optim = _model_and_optim()
    _train_step(model, optim, 1)
    mgr, _ = _manager(tmp_path)
    mgr.save(2, model, optim)
    assert mgr.wait(timeout=30)
    names = os.listdir(tmp_path / committed_name(2))
    assert not [n for n in names if n.endswith(".tmp")]


@pytest.mark.parametrize(
    ("write_s", "step_s", "every"),
    [
        pytest.param(0.0, 0.2, 10, id="no write measured yet: the configured interval"),
        pytest.param(1.5, 0.2, 10, id="fits: 1.1 x 1.5 s = 8.25 steps <= 10"),
        pytest.param(2.0, 0.2, 20, id="6.85 GB at ~3.4 GB/s: 11 steps -> 20"),
        pytest.param(7.0, 0.2, 40, id="38.5 steps -> 40"),
        pytest.param(1000.0, 0.001, 640, id="capped at 64 x the configured interval"),
        pytest.param(1.0, 0.0, 10, id="no step time yet"),
    ],
)
def test_snapshot_every_is_the_smallest_multiple_the_write_fits_in(
    write_s: float, step_s: float, every: int
) -> None:
    assert snapshot_every(10, write_s, step_s) == every
