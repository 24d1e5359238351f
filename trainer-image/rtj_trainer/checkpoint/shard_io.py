"""One rank's shard on disk: writing it from host tensors, copying it, reading or mapping it back.

A shard is `rank-<r>.bin` (the tensors' bytes, back to back) and `rank-<r>.idx` (the skeleton and
each tensor's dtype, shape and offset); layout in `checkpoint_format`. Every writer here checks a
`WriteControl` between chunks, so an abort (a graceful stop, a torn-down job) ends it within one
CHUNK_BYTES write.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ..checkpoint_format import (
    CHUNK_BYTES,
    CheckpointError,
    Manifest,
    ShardIndex,
    TensorEntry,
    crc32_of,
    read_local_meta,
    shard_bin,
    shard_idx,
    write_file_atomic,
)
from .state_tree import as_bytes, dtype_named

FileSums = dict[str, dict[str, Any]]

#: Threads writing the persisted copy of a memory snapshot (`copy_shard`). One thread reading into
#: new buffers, writing and checksumming in turn persisted 13.7 GB at 0.6-0.7 GB/s on an H100 host
#: (19-24 s). `bench/persist_copy.py` times the copies: 3 GB from /dev/shm to the 2-core machine's
#: disk in 2.8-3.7 s with 1 or 4 threads, 1.7-2.4 s mapped (the copy before, which stalled the
#: rank's other threads at its munmap), 9.8-10.3 s for the loop (2 runs). More than one is for
#: stores that want several writes in flight (FSx for Lustre, NVMe).
PERSIST_WRITE_THREADS = 4


class Aborted(Exception):
    """The write was asked to stop (`WriteControl.abort`); its partial files are dropped."""


@dataclass
class WriteControl:
    """Shared by every writer of one rank: the abort flag and an optional bandwidth throttle
    (`bytes_per_s`: tests and benchmarks of "storage slower than the interval")."""

    bytes_per_s: float | None = None
    abort: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if self.abort.is_set():
            raise Aborted

    def throttle(self, written: int, t_start: float) -> None:
        if not self.bytes_per_s:
            return
        ahead = written / self.bytes_per_s - (time.monotonic() - t_start)
        if ahead > 0 and self.abort.wait(ahead):
            raise Aborted


def _entry(t: torch.Tensor, offset: int, nbytes: int) -> TensorEntry:
    return TensorEntry(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes)


def _write_all(f: Any, chunk: memoryview) -> None:
    written = 0
    while written < len(chunk):
        written += f.write(chunk[written:])


def write_shard(
    partial: str,
    rank: int,
    host: list[torch.Tensor],
    tree: dict[str, Any],
    control: WriteControl,
    *,
    throttle: bool = True,
    checksum: bool = True,
    threads: int = 1,
) -> FileSums:
    """This rank's .bin and .idx (holding `tree`: {"state": skeleton, "extra": ...}) in `partial`;
    their sizes and CRC32s (None: `checksum` off, the memory tier: a CRC32 of 6.85 GB takes seconds,
    a memory copy a fraction of that). `threads` > 1 (the memory tier: no checksum, no throttle)
    splits the copy over threads. An existing `.bin.tmp` (a recycled snapshot) is overwritten in place."""
    entries: list[TensorEntry] = []
    bin_path = os.path.join(partial, shard_bin(rank))
    tmp = f"{bin_path}.tmp"
    crc, offset = 0, 0
    t_start = time.monotonic()
    with open(tmp, "r+b" if os.path.exists(tmp) else "wb", buffering=0) as f:
        if threads > 1 and not checksum and not throttle:
            offset = _write_parallel(f.fileno(), host, entries, threads, control)
        else:
            for t in host:
                view = as_bytes(t)
                entries.append(_entry(t, offset, len(view)))
                for start in range(0, len(view), CHUNK_BYTES):
                    control.check()
                    chunk = view[start : start + CHUNK_BYTES]
                    _write_all(f, chunk)
                    if checksum:
                        crc = crc32_of(chunk, crc)
                    offset += len(chunk)
                    if throttle:
                        control.throttle(offset, t_start)
        f.truncate(offset)  # a recycled file may have been longer
        os.fsync(f.fileno())
    os.replace(tmp, bin_path)
    idx = ShardIndex(tree, entries).to_bytes()
    write_file_atomic(os.path.join(partial, shard_idx(rank)), idx)
    return {
        shard_bin(rank): {"size": offset, "crc32": crc if checksum else None},
        shard_idx(rank): {"size": len(idx), "crc32": crc32_of(idx) if checksum else None},
    }


def _write_parallel(
    fd: int, host: list[torch.Tensor], entries: list[TensorEntry], threads: int, control: WriteControl
) -> int:
    """Write `host` into `fd` as the one-writer loop lays it out (appending to `entries`), in
    CHUNK_BYTES pieces spread over `threads` threads: one thread copies a few GB/s into tmpfs,
    well below what the memory bus gives several. The syscalls release the GIL."""
    pieces: list[tuple[memoryview, int]] = []
    offset = 0
    for t in host:
        view = as_bytes(t)
        entries.append(_entry(t, offset, len(view)))
        pieces.extend((view[i : i + CHUNK_BYTES], offset + i) for i in range(0, len(view), CHUNK_BYTES))
        offset += len(view)
    os.ftruncate(fd, offset)  # the final size at once (a recycled file may have been longer)
    _pwrite_pieces(fd, pieces, threads, control)
    return offset


def _pwrite_pieces(
    fd: int,
    pieces: list[tuple[memoryview, int]],
    threads: int,
    control: WriteControl,
) -> None:
    """Write each (bytes, offset) of `pieces` into `fd` with pwrite, spread over `threads` threads
    (the syscalls release the GIL). Returns once every piece is written; on a failure or an abort
    the pieces not begun are dropped and the first error is raised once the running ones are done."""

    def write(piece: tuple[memoryview, int]) -> None:
        control.check()
        _pwrite_all(fd, *piece)

    pool = ThreadPoolExecutor(
        max_workers=min(threads, max(1, len(pieces))), thread_name_prefix="rtj-ckpt-pwrite"
    )
    try:
        futures = [pool.submit(write, piece) for piece in pieces]
        for f in futures:
            f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def copy_shard(
    src: str, partial: str, rank: int, control: WriteControl, threads: int = PERSIST_WRITE_THREADS
) -> FileSums:
    """Copy this rank's memory-tier shard `src` into a partial under root, computing its CRC32 on
    the way (the memory tier has no checksums: committed by rename, in RAM; the persisted copy does).
    This thread reads 64 MiB pieces in order into a few reused buffers and adds each to the CRC32
    while `threads` threads write the pieces read before (`_copy_pieces`)."""
    files = read_local_meta(src)["files"]
    bin_name, idx_name = shard_bin(rank), shard_idx(rank)
    size = int(files[bin_name]["size"])
    bin_path = os.path.join(partial, bin_name)
    tmp = f"{bin_path}.tmp"
    t_start = time.monotonic()
    fin = os.open(os.path.join(src, bin_name), os.O_RDONLY)
    try:
        if os.fstat(fin).st_size != size:
            raise CheckpointError(f"{src}: its files do not have the sizes it was committed with")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, size)
            crc = _copy_pieces(fin, fd, size, threads, control, throttle_from=t_start)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(fin)
    with open(os.path.join(src, idx_name), "rb") as f:
        idx = f.read()
    if len(idx) != files[idx_name]["size"]:
        raise CheckpointError(f"{src}: its files do not have the sizes it was committed with")
    os.replace(tmp, bin_path)
    write_file_atomic(os.path.join(partial, idx_name), idx)
    return {
        bin_name: {"size": size, "crc32": crc},
        idx_name: {"size": len(idx), "crc32": crc32_of(idx)},
    }


def _copy_pieces(
    fin: int, fd: int, size: int, threads: int, control: WriteControl, *, throttle_from: float
) -> int:
    """Copy `size` bytes of `fin` to `fd` in CHUNK_BYTES pieces; the CRC32 of the bytes.

    Read with pread, never mapped: a mapping of the snapshot in this process would take the rank's
    mmap lock for every page it faults in and, at its munmap, for as long as unmapping 13.7 GB takes
    (tenths of a second), and any thread of the rank that maps memory meanwhile (the training
    thread's allocations) waits. `threads` + 1 buffers are reused: this thread reads a piece and adds
    it to the CRC32 while the writers write the pieces before it; every call here releases the GIL."""
    threads = max(1, min(threads, -(-size // CHUNK_BYTES)))
    free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(threads + 1):
        free.put(bytearray(CHUNK_BYTES))
    lock, written, crc = threading.Lock(), 0, 0
    errors: list[BaseException] = []

    def write(buf: bytearray, at: int, n: int) -> None:
        nonlocal written
        try:
            control.check()
            _pwrite_all(fd, memoryview(buf)[:n], at)
            with lock:
                written += n
                total = written
            control.throttle(total, throttle_from)
        except BaseException as e:
            errors.append(e)  # the reader stops at its next piece
            raise
        finally:
            free.put(buf)

    futures = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rtj-ckpt-pwrite") as pool:
        try:
            for at in range(0, size, CHUNK_BYTES):
                control.check()
                buf = free.get()
                if errors:
                    raise errors[0]
                n = _pread_full(fin, buf, at, min(CHUNK_BYTES, size - at))
                crc = crc32_of(memoryview(buf)[:n], crc)
                futures.append(pool.submit(write, buf, at, n))
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()  # those not begun; the running ones end before the pool's exit
    return crc


def _pwrite_all(fd: int, chunk: memoryview, at: int) -> None:
    done = 0
    while done < len(chunk):
        done += os.pwrite(fd, chunk[done:], at + done)


def _pread_full(fin: int, buf: bytearray, at: int, n: int) -> int:
    view, got = memoryview(buf), 0
    while got < n:
        k = os.preadv(fin, [view[got:n]], at + got)
        if k == 0:
            raise CheckpointError(f"the snapshot ended at byte {at + got}, {n - got} short")
        got += k
    return got


def read_index(ckpt_dir: str, rank: int, manifest: Manifest) -> tuple[ShardIndex, int]:
    """One rank's shard index, checked against the manifest's size and CRC32 (a memory-tier snapshot
    of the copy path has none), and the size its .bin must have."""
    files = manifest.ranks.get(rank)
    if files is None:
        raise CheckpointError(f"{ckpt_dir}: no shard for rank {rank}")
    idx_meta, bin_meta = files[shard_idx(rank)], files[shard_bin(rank)]
    with open(os.path.join(ckpt_dir, shard_idx(rank)), "rb") as f:
        idx_bytes = f.read()
    checked = idx_meta["crc32"] is not None
    if len(idx_bytes) != idx_meta["size"] or (checked and crc32_of(idx_bytes) != idx_meta["crc32"]):
        raise CheckpointError(f"{ckpt_dir}: {shard_idx(rank)} fails its checksum")
    return ShardIndex.from_bytes(idx_bytes), int(bin_meta["size"])


def read_shard(ckpt_dir: str, rank: int, manifest: Manifest) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors) of one rank's shard, checked against the manifest's sizes and CRC32
    (sizes only for a memory-tier snapshot's .bin, which carries no CRC32: its tensors are then
    views of the mapped file, `map_shard`)."""
    index, _size = read_index(ckpt_dir, rank, manifest)
    bin_meta = manifest.ranks[rank][shard_bin(rank)]
    bin_path = os.path.join(ckpt_dir, shard_bin(rank))
    if bin_meta["crc32"] is None:
        return shard_state(index), map_shard(bin_path, index, bin_meta["size"])
    return shard_state(index), _read_checked(bin_path, index, bin_meta)


def _read_checked(bin_path: str, index: ShardIndex, bin_meta: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors read from the file at their offsets, the CRC32 taken over every byte of it (the
    padding a memory-tier slot aligns tensors with included: `snapshot_ring.layout`)."""
    tensors: list[torch.Tensor] = []
    crc, pos, size = 0, 0, int(bin_meta["size"])

    def read_into(view: memoryview) -> None:
        nonlocal crc, pos
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise CheckpointError(f"{bin_path} is truncated")
            got += n
        crc = crc32_of(view, crc)
        pos += len(view)

    with open(bin_path, "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != size:
            raise CheckpointError(f"{bin_path} does not have the size it was written with")
        for e in sorted(index.entries, key=lambda e: e.offset):
            if e.offset < pos or e.offset + e.nbytes > size:
                raise CheckpointError(f"{bin_path}: an entry overlaps another or lies outside the file")
            if e.offset > pos:
                read_into(memoryview(bytearray(e.offset - pos)))
            raw = torch.empty(e.nbytes, dtype=torch.uint8)
            if e.nbytes:
                read_into(memoryview(raw.numpy()).cast("B"))
            tensors.append(raw)
        if size > pos:
            read_into(memoryview(bytearray(size - pos)))
    if crc != bin_meta["crc32"]:
        raise CheckpointError(f"{bin_path} fails its checksum")
    by_offset = dict(
        zip(sorted(range(len(index.entries)), key=lambda i: index.entries[i].offset), tensors, strict=True)
    )
    return [by_offset[i].view(dtype_named(e.dtype)).reshape(e.shape) for i, e in enumerate(index.entries)]


def shard_state(index: ShardIndex) -> dict[str, Any]:
    skeleton = index.skeleton
    return {
        "model": skeleton["state"]["model"],
        "optim": skeleton["state"]["optim"],
        "extra": skeleton["extra"],
    }


def map_shard(path: str, index: ShardIndex, size: int) -> list[torch.Tensor]:
    """A memory-tier shard's tensors as views of the file mapped into memory: its pages are already
    in the tmpfs, so nothing is allocated or copied before the state is loaded from them (reading
    them into new tensors took 14 s of a restart for 13.7 GB on an H200). Copy-on-write
    (MAP_PRIVATE): the snapshot is never changed through them."""
    if os.path.getsize(path) != size:
        raise CheckpointError(f"{path} does not have the size it was written with")
    whole = (
        torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
        if size
        else torch.empty(0, dtype=torch.uint8)
    )
    return view_shard(whole, index, size, path)


def view_shard(whole: torch.Tensor, index: ShardIndex, size: int, path: str) -> list[torch.Tensor]:
    """The shard's tensors as views of its mapped bytes `whole` (`size` long)."""
    if whole.numel() != size:
        raise CheckpointError(f"{path} does not have the size it was written with")
    tensors = []
    for e in index.entries:
        if e.offset < 0 or e.offset + e.nbytes > size:
            raise CheckpointError(f"{path}: an entry lies outside the file")
        raw = whole[e.offset : e.offset + e.nbytes]
        dtype = dtype_named(e.dtype)
        if e.offset % dtype.itemsize:  # a view must be aligned to its element size
            raw = raw.clone()
        tensors.append(raw.view(dtype).reshape(e.shape))
    return tensors
