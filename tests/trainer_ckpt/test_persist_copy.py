"""The persisted copy of a memory snapshot (`checkpoint_copy.copy_shard`): the calling thread reads
the snapshot in pieces and computes the CRC32 while several threads write the pieces, and the
snapshot is never mapped into the rank (its munmap would hold the rank's mmap lock). A rank makes it
in a child process (`copy_shard_in_child`): the same files, sums and errors, killed by an abort and
by its parent's death. Real files and processes; a shard of a few 64 MiB pieces and an odd tail, so
that every thread writes and the last piece is short."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint.shard_io import (
    Aborted,
    WriteControl,
    copy_shard,
    copy_shard_in_child,
    write_shard,
)
from rtj_trainer.checkpoint_copy import MODULE, PERSIST_NICE
from rtj_trainer.checkpoint_format import CHUNK_BYTES, CheckpointError, shard_bin, shard_idx, write_local_meta
from tmpfs import mounted_tmpfs

pytestmark = pytest.mark.trainer

#: The copy in this thread (the pod's entrypoint's handoff) and in a child process (a rank's).
COPIES = pytest.mark.parametrize("copy", [copy_shard, copy_shard_in_child], ids=["in-thread", "in-child"])
Copy = Callable[..., dict]


def _snapshot(tmp_path: Path, nbytes: int) -> tuple[str, bytes]:
    """A memory-tier shard of rank 0 (no checksums, as the tier writes it) and its .bin's bytes."""
    src = tmp_path / "shm" / "step-7"
    src.mkdir(parents=True)
    gen = torch.Generator().manual_seed(7)
    big = torch.randint(0, 256, (nbytes - 1000,), dtype=torch.uint8, generator=gen)
    small = torch.randn(250, generator=gen)  # 1000 bytes
    files = write_shard(
        str(src), 0, [big, small], {"state": ["big", "small"], "extra": {}}, WriteControl(),
        throttle=False, checksum=False,
    )  # fmt: skip
    meta = {"step": 7, "nonce": 1, "worldSize": 1, "rank": 0, "time": "2026-12-06T00:00:00Z", "files": files}
    write_local_meta(str(src), meta)
    return str(src), (src / shard_bin(0)).read_bytes()


@COPIES
@pytest.mark.parametrize("threads", [1, 3])
def test_the_copy_has_every_byte_and_the_crc32_of_them(tmp_path: Path, threads: int, copy: Copy) -> None:
    src, data = _snapshot(tmp_path, 2 * CHUNK_BYTES + 4099)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    files = copy(src, str(partial), 0, WriteControl(), threads=threads)
    copied = (partial / shard_bin(0)).read_bytes()
    assert copied == data
    assert files[shard_bin(0)] == {"size": len(data), "crc32": zlib.crc32(data)}
    idx = (Path(src) / shard_idx(0)).read_bytes()
    assert (partial / shard_idx(0)).read_bytes() == idx
    assert files[shard_idx(0)] == {"size": len(idx), "crc32": zlib.crc32(idx)}
    assert not (partial / f"{shard_bin(0)}.tmp").exists()


@COPIES
def test_an_aborted_copy_leaves_no_shard(tmp_path: Path, copy: Copy) -> None:
    src, _data = _snapshot(tmp_path, 2 * CHUNK_BYTES + 4099)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    control = WriteControl()
    control.abort.set()
    with pytest.raises(Aborted):
        copy(src, str(partial), 0, control, threads=3)
    assert not (partial / shard_bin(0)).exists() and not (partial / shard_idx(0)).exists()


@COPIES
def test_a_snapshot_whose_file_has_another_size_is_refused(tmp_path: Path, copy: Copy) -> None:
    src, _data = _snapshot(tmp_path, 3 * 4096)
    with open(os.path.join(src, shard_bin(0)), "ab") as f:
        f.write(b"x")
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    with pytest.raises(CheckpointError, match="sizes it was committed with"):
        copy(src, str(partial), 0, WriteControl())
    assert not (partial / shard_bin(0)).exists()


def test_the_snapshot_is_never_mapped_while_it_is_copied(tmp_path: Path) -> None:
    src, data = _snapshot(tmp_path, 3 * CHUNK_BYTES)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    control = WriteControl(bytes_per_s=len(data) / 1.5)  # ~1.5 s: time to look at the mappings
    done, seen = threading.Event(), []

    def look() -> None:
        while not done.is_set():
            seen.append(Path("/proc/self/maps").read_text())
            done.wait(0.05)

    looker = threading.Thread(target=look)
    looker.start()
    try:
        copy_shard(src, str(partial), 0, control, threads=2)
    finally:
        done.set()
        looker.join()
    assert len(seen) > 10
    assert not [m for m in seen if os.path.join(src, shard_bin(0)) in m]
    assert (partial / shard_bin(0)).read_bytes() == data


@COPIES
def test_a_full_disk_ends_the_copy_with_its_error_and_leaves_no_shard(tmp_path: Path, copy: Copy) -> None:
    src, _data = _snapshot(tmp_path, 4 * CHUNK_BYTES)
    with mounted_tmpfs(tmp_path / "small", "96m") as disk:
        partial = disk / "partial"
        partial.mkdir()
        with pytest.raises(OSError) as raised:
            copy(src, str(partial), 0, WriteControl(), threads=3)
        assert raised.value.errno == 28  # ENOSPC, from a writer thread (of the child: its errno kept)
        assert not (partial / shard_bin(0)).exists() and not (partial / shard_idx(0)).exists()


def _copiers_of(parent: int) -> list[int]:
    """Live child-copy processes whose parent is `parent`."""
    found = []
    for name in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{name}/stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if MODULE in cmd and int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(name))
    return found


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"  # exited; its new parent has not reaped it yet


def test_an_abort_mid_copy_kills_the_child_and_leaves_no_shard(tmp_path: Path) -> None:
    src, data = _snapshot(tmp_path, 2 * CHUNK_BYTES)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    control = WriteControl(bytes_per_s=len(data) / 30)  # 30 s unless aborted
    writing = partial / f"{shard_bin(0)}.tmp"  # the child has begun to write

    def abort_once_writing() -> None:
        wait_for(writing.exists, timeout=30, interval=0.02, message="the child's partial file")
        control.abort.set()

    threading.Thread(target=abort_once_writing).start()
    t0 = time.monotonic()
    with pytest.raises(Aborted):
        copy_shard_in_child(src, str(partial), 0, control)
    assert time.monotonic() - t0 < 10
    assert _copiers_of(os.getpid()) == []
    assert not (partial / shard_bin(0)).exists() and not (partial / shard_idx(0)).exists()


def test_the_child_copies_niced_below_the_rank(tmp_path: Path) -> None:
    """A background persist yields cores to training: the child (and any copy thread it has
    started) runs PERSIST_NICE steps nicer than the rank."""
    src, data = _snapshot(tmp_path, 2 * CHUNK_BYTES)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    control = WriteControl(bytes_per_s=len(data) / 30)
    writing = partial / f"{shard_bin(0)}.tmp"
    seen: dict[str, list[int]] = {}

    def look_then_abort() -> None:
        wait_for(writing.exists, timeout=30, interval=0.02, message="the child's partial file")
        [child] = _copiers_of(os.getpid())
        seen["nice"] = [_nice(f"/proc/{child}/task/{tid}") for tid in os.listdir(f"/proc/{child}/task")]
        control.abort.set()

    threading.Thread(target=look_then_abort).start()
    with pytest.raises(Aborted):
        copy_shard_in_child(src, str(partial), 0, control)
    mine = _nice(f"/proc/{os.getpid()}")
    assert set(seen["nice"]) == {min(mine + PERSIST_NICE, 19)}, seen


def _nice(proc_dir: str) -> int:
    stat = Path(proc_dir, "stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])  # field 19: nice


def test_the_child_dies_with_the_rank_that_started_it(tmp_path: Path) -> None:
    src, data = _snapshot(tmp_path, 2 * CHUNK_BYTES)
    partial = tmp_path / "persist" / "partial"
    partial.mkdir(parents=True)
    # A stand-in rank: persists in a thread, throttled to 60 s, and is SIGKILLed meanwhile.
    rank = subprocess.Popen([sys.executable, "-c", f"""
import threading
from rtj_trainer.checkpoint.shard_io import WriteControl, copy_shard_in_child
args = ({src!r}, {str(partial)!r}, 0, WriteControl({len(data) / 60}))
t = threading.Thread(target=copy_shard_in_child, args=args)
t.start(); t.join()
"""])  # fmt: skip
    try:
        wait_for(lambda: _copiers_of(rank.pid), timeout=30, message="the rank's copy process")
        [child] = _copiers_of(rank.pid)
        rank.send_signal(signal.SIGKILL)
        rank.wait()
        wait_for(lambda: _gone(child), timeout=10, message="the copy process gone")
    finally:
        rank.kill()
    assert not (partial / shard_bin(0)).exists()
