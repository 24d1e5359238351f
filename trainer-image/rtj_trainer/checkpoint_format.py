"""On-storage layout of rtj checkpoints: names, shard files, markers, the manifest, validation.

Pure file handling (no threads, no torch.distributed), used by `rtj_trainer.checkpoint`.

    <root>/step-0000000040/                 committed: renamed into place by rank 0 after all ranks
        manifest.json                       sizes + CRC32 of every rank's files (written last)
        rank-00000.bin  rank-00000.idx      rank 0's tensor bytes, and its index (tree + offsets)
        rank-00001.bin  ...
        rank-00000.done ...                 per-rank done markers (what rank 0 waited for)
    <root>/step-0000000060.1a2b3c.partial/  in flight (or torn by a crash): never loaded
        handoff-until                       a pod's entrypoint persists into it until this time
    <root>/step-0000000020.trash.<pid>/     being deleted (keep-last-k): never loaded

A directory named `step-<N>` exists only after its manifest was fsynced, so "committed" is a
single atomic rename.

The node-local memory tier (a tmpfs such as /dev/shm) has one directory per rank, each snapshot
committed by that rank alone with one rename; which step the ranks resume from is agreed at load:

    <local>/rank-00001/step-0000000050.1a2b3c/          committed by rank 1
        rank-00001.bin  rank-00001.idx  snapshot.json   snapshot.json: step, nonce, world size,
                                                        sizes + CRC32 of the two files (written last)
    <local>/rank-00001/step-0000000060.4d5e6f.partial/  in flight or torn: never loaded
    <local>/rank-00001/step-0000000040.1a2b3c.trash/    being deleted: never loaded

The nonce (agreed by all ranks at the save) names one save: shards of the same step from two
different saves (a step redone after a restart) never mix.

Loading validates the manifest against the files (sizes), and each rank's files against their
CRC32 while reading them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .permanent import PermanentError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_COMMITTED_RE = re.compile(r"^step-(\d{10})$")
_PARTIAL_RE = re.compile(r"^step-(\d{10})\.([0-9a-f]+)\.partial$")
_TRASH_RE = re.compile(r"^step-(\d{10})\.trash\.")
_LOCAL_RE = re.compile(r"^step-(\d{10})\.([0-9a-f]+)$")
LOCAL_META = "snapshot.json"
#: Bytes written (and checksummed) per system call; also how often a writer checks for abort.
CHUNK_BYTES = 64 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, torn, corrupt or does not fit this job."""


class WorldSizeMismatch(CheckpointError, PermanentError):
    """The newest checkpoint was written by another number of ranks: every restart would fail alike."""


def committed_name(step: int) -> str:
    return f"step-{step:010d}"


def partial_name(step: int, nonce: int) -> str:
    return f"step-{step:010d}.{nonce:x}.partial"


def shard_bin(rank: int) -> str:
    return f"rank-{rank:05d}.bin"


def shard_idx(rank: int) -> str:
    return f"rank-{rank:05d}.idx"


def done_marker(rank: int) -> str:
    return f"rank-{rank:05d}.done"


def failed_marker(rank: int) -> str:
    return f"rank-{rank:05d}.failed"


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: str, data: bytes) -> None:
    """tmp file + fsync + rename + fsync of the directory: the file is whole or absent."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def committed_steps(root: str) -> list[int]:
    """Steps of the committed checkpoint directories under root, newest first (not validated);
    none when root cannot be listed (absent, or a storage volume that is unreadable right now)."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    steps = [int(m.group(1)) for n in names if (m := _COMMITTED_RE.match(n))]
    return sorted(steps, reverse=True)


#: In a partial under root: the wall-clock time (`time.time()`, text) until which a pod's entrypoint
#: persists into it after its ranks exited (rtj_trainer.checkpoint.handoff). The partial is not stale
#: before then: the ranks of the job's next incarnation, which may start meanwhile on other pods,
#: must not remove a checkpoint about to be committed.
HANDOFF_UNTIL = "handoff-until"


def _handed_off_until(partial: str) -> float:
    try:
        with open(os.path.join(partial, HANDOFF_UNTIL)) as f:
            return float(f.read())
    except (OSError, ValueError):
        return 0.0


def stale_entries(root: str, keep_partial: str | None = None) -> list[str]:
    """Partial and trash directories under root (except `keep_partial`, and partials a pod's
    entrypoint is still persisting into): leftovers of crashes."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    now = time.time()
    return [
        os.path.join(root, n)
        for n in names
        if n != keep_partial
        and (_TRASH_RE.match(n) or (_PARTIAL_RE.match(n) and _handed_off_until(os.path.join(root, n)) <= now))
    ]


def remove_tree(path: str) -> None:
    """Delete a directory so that no half-deleted copy can look committed: rename, then rmtree."""
    base = os.path.basename(path)
    m = _COMMITTED_RE.match(base)
    if m:
        trash = os.path.join(os.path.dirname(path), f"{base}.trash.{os.getpid()}")
        os.rename(path, trash)
        path = trash
    shutil.rmtree(path, ignore_errors=True)


# --- the tree of a state dict ---------------------------------------------------------------------
# The skeleton keeps the nesting (dicts, lists, tuples) and the plain values (ints, floats, strings,
# bools, None); each tensor is replaced by {"__tensor__": i}. It is pickled, and read back by an
# unpickler that refuses every global, so a checkpoint cannot carry code.

_TENSOR_KEY = "__tensor__"


def tensor_ref(index: int) -> dict[str, int]:
    return {_TENSOR_KEY: index}


def ref_index(value: Any) -> int | None:
    if isinstance(value, dict) and len(value) == 1 and _TENSOR_KEY in value:
        return int(value[_TENSOR_KEY])
    return None


class _NoGlobalsUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise CheckpointError(f"checkpoint index refers to {module}.{name}; only plain data is allowed")


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # torch dtype name, e.g. "bfloat16"
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class ShardIndex:
    skeleton: Any
    entries: list[TensorEntry]

    def to_bytes(self) -> bytes:
        plain = {
            "format": FORMAT_VERSION,
            "skeleton": self.skeleton,
            "entries": [(e.dtype, list(e.shape), e.offset, e.nbytes) for e in self.entries],
        }
        return pickle.dumps(plain, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardIndex:
        plain = _NoGlobalsUnpickler(io.BytesIO(data)).load()
        if not isinstance(plain, dict) or plain.get("format") != FORMAT_VERSION:
            raise CheckpointError("checkpoint index has an unknown format")
        entries = [TensorEntry(d, tuple(s), o, n) for d, s, o, n in plain["entries"]]
        return cls(plain["skeleton"], entries)


def iter_chunks(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), CHUNK_BYTES):
        yield view[start : start + CHUNK_BYTES]


def crc32_of(data: bytes | memoryview, crc: int = 0) -> int:
    return zlib.crc32(data, crc)


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


# --- markers and the manifest ---------------------------------------------------------------------
def write_done_marker(partial_dir: str, rank: int, files: dict[str, dict[str, int]]) -> None:
    write_file_atomic(
        os.path.join(partial_dir, done_marker(rank)), json.dumps({"rank": rank, "files": files}).encode()
    )


def read_done_marker(partial_dir: str, rank: int) -> dict[str, dict[str, int]] | None:
    try:
        with open(os.path.join(partial_dir, done_marker(rank))) as f:
            return json.load(f)["files"]
    except FileNotFoundError:
        return None


def write_failed_marker(partial_dir: str, rank: int, reason: str) -> None:
    with contextlib.suppress(OSError), open(os.path.join(partial_dir, failed_marker(rank)), "w") as f:
        f.write(reason[:1024])


def any_failed(partial_dir: str, world_size: int) -> bool:
    return any(os.path.exists(os.path.join(partial_dir, failed_marker(r))) for r in range(world_size))


@dataclass(frozen=True)
class Manifest:
    step: int
    nonce: int
    world_size: int
    time: str
    #: rank -> file name -> {"size": bytes, "crc32": int}
    ranks: dict[int, dict[str, dict[str, int]]]
    extra: dict[str, Any]

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT_VERSION,
            "step": self.step,
            "nonce": self.nonce,
            "worldSize": self.world_size,
            "time": self.time,
            "ranks": {str(r): files for r, files in self.ranks.items()},
            "extra": self.extra,
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    @classmethod
    def read(cls, ckpt_dir: str) -> Manifest:
        try:
            with open(os.path.join(ckpt_dir, MANIFEST), "rb") as f:
                doc = json.loads(f.read())
            if doc.get("format") != FORMAT_VERSION:
                raise CheckpointError(f"{ckpt_dir}: unknown manifest format {doc.get('format')!r}")
            return cls(
                step=int(doc["step"]),
                nonce=int(doc["nonce"]),
                world_size=int(doc["worldSize"]),
                time=str(doc["time"]),
                ranks={int(r): files for r, files in doc["ranks"].items()},
                extra=dict(doc.get("extra", {})),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{ckpt_dir}: unreadable manifest: {e}") from e

    def validate_files(self, ckpt_dir: str, *, checksums: bool = False) -> None:
        """Every file the manifest names exists with its size (and CRC32 when `checksums`)."""
        if set(self.ranks) != set(range(self.world_size)):
            raise CheckpointError(f"{ckpt_dir}: manifest lists ranks {sorted(self.ranks)}")
        for files in self.ranks.values():
            for name, meta in files.items():
                path = os.path.join(ckpt_dir, name)
                try:
                    size = os.path.getsize(path)
                except OSError as e:
                    raise CheckpointError(f"{ckpt_dir}: missing {name}") from e
                if size != meta["size"]:
                    raise CheckpointError(
                        f"{ckpt_dir}: {name} has {size} bytes, manifest says {meta['size']}"
                    )
                if checksums and file_crc32(path) != meta["crc32"]:
                    raise CheckpointError(f"{ckpt_dir}: {name} fails its checksum")


def latest_valid(root: str, *, world_size: int | None = None, checksums: bool = False) -> int | None:
    """Newest committed step whose manifest validates (and fits `world_size`), or None."""
    for step in committed_steps(root):
        ckpt_dir = os.path.join(root, committed_name(step))
        try:
            manifest = Manifest.read(ckpt_dir)
            manifest.validate_files(ckpt_dir, checksums=checksums)
        except CheckpointError:
            continue
        if world_size is not None and manifest.world_size != world_size:
            raise WorldSizeMismatch(
                f"{ckpt_dir} was written by {manifest.world_size} ranks, this job has {world_size}; "
                "resuming on a different world size is not supported"
            )
        return step
    return None


# --- the node-local memory tier ------------------------------------------------------------------
def local_rank_dir(local_root: str, rank: int) -> str:
    return os.path.join(local_root, f"rank-{rank:05d}")


def local_name(step: int, nonce: int) -> str:
    return f"step-{step:010d}.{nonce:x}"


def local_snapshots(rank_dir: str) -> list[tuple[int, int]]:
    """(step, nonce) of the committed snapshots in one rank's local directory, newest first."""
    try:
        names = os.listdir(rank_dir)
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), int(m.group(2), 16)) for n in names if (m := _LOCAL_RE.match(n))]
    return sorted(found, reverse=True)


def is_local_name(name: str) -> bool:
    """`name` is a committed snapshot's directory name (not a partial, a spare or trash)."""
    return _LOCAL_RE.match(name) is not None


def remove_local(path: str) -> None:
    """Delete a local snapshot so that a crash mid-way never leaves it looking committed."""
    if _LOCAL_RE.match(os.path.basename(path)):
        trash = f"{path}.trash"
        os.rename(path, trash)
        path = trash
    shutil.rmtree(path, ignore_errors=True)


def write_local_meta(snap_dir: str, doc: dict[str, Any]) -> None:
    write_file_atomic(os.path.join(snap_dir, LOCAL_META), json.dumps(doc, sort_keys=True).encode())


def read_local_meta(snap_dir: str) -> dict[str, Any]:
    try:
        with open(os.path.join(snap_dir, LOCAL_META), "rb") as f:
            doc = json.loads(f.read())
        return {
            "step": int(doc["step"]),
            "nonce": int(doc["nonce"]),
            "worldSize": int(doc["worldSize"]),
            "rank": int(doc["rank"]),
            "time": str(doc["time"]),
            "files": dict(doc["files"]),
            "extra": dict(doc.get("extra", {})),
        }
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{snap_dir}: unreadable {LOCAL_META}: {e}") from e
