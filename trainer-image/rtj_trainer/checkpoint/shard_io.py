"""One rank's shard on disk: writing it from host tensors, copying it, reading or mapping it back.

A shard is `rank-<r>.bin` (the tensors' bytes, back to back) and `rank-<r>.idx` (the skeleton and
each tensor's dtype, shape and offset); layout in `checkpoint_format`. Every writer here checks a
`WriteControl` between chunks, so an abort (a graceful stop, a torn-down job) ends it within one
CHUNK_BYTES write.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..checkpoint_copy import (  # the persisted copy, torch-free; re-exported for the tiers
    PERSIST_WRITE_THREADS as PERSIST_WRITE_THREADS,
)
from ..checkpoint_copy import Aborted as Aborted
from ..checkpoint_copy import FileSums as FileSums
from ..checkpoint_copy import WriteControl as WriteControl
from ..checkpoint_copy import _pwrite_all
from ..checkpoint_copy import copy_shard as copy_shard
from ..checkpoint_copy import copy_shard_in_child as copy_shard_in_child
from ..checkpoint_format import (
    CHUNK_BYTES,
    CheckpointError,
    Manifest,
    ShardIndex,
    TensorEntry,
    crc32_of,
    shard_bin,
    shard_idx,
    write_file_atomic,
)
from .state_tree import as_bytes, dtype_named


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
