"""The node-local memory tier: this rank's snapshots in a tmpfs (the pod's /dev/shm), one rename each.

    <local_root>/rank-<r>/step-<N>.<nonce>/          committed (layout in `checkpoint_format`)
    <local_root>/rank-<r>/step-<N>.<nonce>.partial/  being written, or torn by a kill: never loaded

Each snapshot, once in host memory, is written here by the writer thread and committed by this rank
alone; which step the ranks resume from is agreed at load (`resume`). The oldest snapshot that is
pruned after a new one commits is recycled for it: overwriting its file in place skips the page
allocation of a new tmpfs file (3-4x the write time measured). Snapshots being persisted, being
replicated, or replicated last are `protected` (the owner says which) and never pruned nor recycled.

Snapshots without a second write (`snapshot_ring`): at a save the training thread `claim`s a slot
(a spare, else the oldest snapshot this one replaces, uncommitted by one rename; never a protected
one), the copy lands in its mapped file (on a GPU through pinned buffers the writer copies from),
and the writer thread `commit`s: the index with its CRC32, the metadata, one rename. `prune`
turns snapshots it no longer keeps into spares (`spare-<k>`) while the ring holds fewer than
keep + 1 slots, so their files stay mapped and their pages allocated.
`read` maps a snapshot shared through the ring, so a restarted rank's first snapshot reuses the
mapping its load made.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from rtj.contract import FaultReason

from ..checkpoint_format import (
    LOCAL_META,
    CheckpointError,
    Manifest,
    ShardIndex,
    crc32_of,
    is_local_name,
    local_name,
    local_rank_dir,
    local_snapshots,
    read_local_meta,
    remove_local,
    shard_bin,
    shard_idx,
    write_file_atomic,
    write_local_meta,
)
from .device_stage import DeviceStage, copy_bytes
from .events import CheckpointEvent, EventLog, now
from .persistent import Shard
from .shard_io import WriteControl, read_index, read_shard, shard_state, view_shard, write_shard
from .snapshot_ring import SnapshotRing
from .staging import Snapshot

log = logging.getLogger("rtj_trainer")

#: Spare ring slots: a snapshot's file kept, mapped, for the next snapshot (`SnapshotRing`).
SPARE_PREFIX = "spare-"
#: In the rank's directory: this rank ran out of GPU memory while it staged snapshots on the GPU
#: (`CheckpointManager.stop_gpu_staging`); its next processes in this pod stage none.
GPU_STAGING_OFF = "gpu-staging-off"


class MemoryTier:
    def __init__(
        self,
        local_root: str,
        *,
        rank: int,
        world_size: int,
        keep: int,
        write_threads: int,
        control: WriteControl,
        events: EventLog,
    ) -> None:
        self.local_root = local_root
        self.dir = local_rank_dir(local_root, rank)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.write_threads = write_threads
        self._control = control
        self._events = events
        #: The snapshots its owner keeps whatever their age (being persisted or replicated).
        self.protected: Callable[[], tuple[str | None, ...]] = lambda: ()
        #: Held while choosing what to prune or recycle, and by the replicator's protection.
        self.lock = threading.Lock()
        self.last_write_s = 0.0  # this rank's last snapshot write (read by the training thread)
        #: The snapshot files as host buffers (`snapshot_ring`); None: snapshots are copied in.
        self.ring: SnapshotRing | None = None
        #: The GPU staging buffer's way back (`device_stage`): a restarted rank's load goes through it.
        self.device: DeviceStage | None = None
        os.makedirs(self.dir, exist_ok=True)
        # Only the partials a killed predecessor left: its committed snapshots are the candidates
        # of the resume (a lost peer's replica may be of an older one than the newest two).
        self.prune(protect=None, committed=False)

    @property
    def gpu_staging_refused(self) -> bool:
        """A process of this rank in this pod ran out of GPU memory with a staging buffer."""
        return os.path.exists(os.path.join(self.dir, GPU_STAGING_OFF))

    def refuse_gpu_staging(self) -> None:
        """Make this rank's next processes in this pod take the pinned path (the pod's memory
        volume outlives in-job and in-place restarts; a new pod tries staging again)."""
        with contextlib.suppress(OSError), open(os.path.join(self.dir, GPU_STAGING_OFF), "w"):
            pass

    def path(self, step: int, nonce: int) -> str:
        return os.path.join(self.dir, local_name(step, nonce))

    def snapshots(self) -> list[tuple[int, int]]:
        """(step, nonce) of this rank's committed snapshots, newest first."""
        return local_snapshots(self.dir)

    def has(self, step: int, nonce: int) -> bool:
        return os.path.isdir(self.path(step, nonce))

    # --- writing (the writer thread) ---------------------------------------------------------------
    def write(self, snap: Snapshot) -> str | None:
        """Write and commit `snap` (host buffers -> this rank's snapshot, one rename); its path, or
        None after a failure (reported; ENOSPC on the memory volume, most likely)."""
        final = self.path(snap.step, snap.nonce)
        partial = f"{final}.partial"
        try:
            self._recycle(partial)
            snap.wait_copied()
            t0 = time.monotonic()
            files = write_shard(
                partial, self.rank, snap.host, snap.tree, self._control,
                throttle=False, checksum=False, threads=self.write_threads,
            )  # fmt: skip
            seconds = time.monotonic() - t0
            self.last_write_s = seconds
            write_local_meta(partial, self._meta(snap, files))
            os.rename(partial, final)
        except Exception as e:
            shutil.rmtree(partial, ignore_errors=True)
            msg = f"memory snapshot of step {snap.step} not written: {e!r}"
            self._events.fault(snap.step, FaultReason.MEMORY_SNAPSHOT_FAILED, msg)
            return None
        self._events.put(CheckpointEvent("snapshot", snap.step, now(), seconds=seconds))
        return final

    # --- the ring (`snapshot_ring`): claimed by the training thread, committed by the writer ---------
    def slot_file(self, slot_dir: str) -> str:
        return os.path.join(slot_dir, shard_bin(self.rank))

    def spares(self) -> list[str]:
        try:
            return sorted(
                os.path.join(self.dir, n) for n in os.listdir(self.dir) if n.startswith(SPARE_PREFIX)
            )
        except FileNotFoundError:
            return []

    def claim(self, step: int, nonce: int) -> str:
        """The `.partial` of snapshot (step, nonce), made of a spare slot, else of the oldest snapshot
        this one replaces (never a protected one), else new; its file is written in place."""
        partial = f"{self.path(step, nonce)}.partial"
        with self.lock:
            spares = self.spares()
            if spares:
                os.rename(spares[0], partial)
                return partial
            protected = {os.path.basename(p) for p in self.protected() if p}
            old = [local_name(s, n) for s, n in self.snapshots()[self.keep - 1 :]]
            old = [n for n in old if n not in protected]
            if not old:
                os.makedirs(partial, exist_ok=True)
                return partial
            os.rename(os.path.join(self.dir, old[-1]), partial)
        for name in (LOCAL_META, shard_idx(self.rank)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(partial, name))
        return partial

    def ring_files(self, size: int) -> list[str]:
        """The slot files a coming snapshot of `size` bytes may reuse, in the order claims take them:
        the spares (made up to keep + 1 slots in all), then the committed snapshots of that size,
        oldest first (never resized: resume candidates)."""
        with self.lock:
            committed = [self.slot_file(self.path(s, n)) for s, n in self.snapshots()]
            spares = self.spares()
            for k in range(len(committed) + len(spares), self.keep + 1):
                spare = os.path.join(self.dir, f"{SPARE_PREFIX}{k}")
                os.makedirs(spare, exist_ok=True)
                spares.append(spare)
        same = [f for f in reversed(committed) if os.path.exists(f) and os.path.getsize(f) == size]
        return [self.slot_file(d) for d in spares] + same

    def commit(self, snap: Snapshot) -> str | None:
        """Commit a snapshot whose tensors were copied into its claimed slot: its index, metadata and
        one rename; its path, or None after a failure (reported)."""
        assert snap.partial is not None and snap.entries is not None
        partial, final = snap.partial, self.path(snap.step, snap.nonce)
        t0 = time.monotonic()  # the copy included: the slot is busy until it lands
        try:
            snap.wait_copied()
            if snap.slot is not None:  # staged in pinned memory (a GPU): into the slot's pages
                for dst, src in zip(snap.slot, snap.host, strict=True):
                    copy_bytes(dst, src)
            size = os.path.getsize(self.slot_file(partial))
            idx = ShardIndex(snap.tree, list(snap.entries)).to_bytes()
            write_file_atomic(os.path.join(partial, shard_idx(self.rank)), idx)
            files = {
                shard_bin(self.rank): {"size": size, "crc32": None},
                shard_idx(self.rank): {"size": len(idx), "crc32": crc32_of(idx)},
            }
            write_local_meta(partial, self._meta(snap, files))
            os.rename(partial, final)
        except Exception as e:
            self._drop(partial)
            msg = f"memory snapshot of step {snap.step} not committed: {e!r}"
            self._events.fault(snap.step, FaultReason.MEMORY_SNAPSHOT_FAILED, msg)
            return None
        self.last_write_s = time.monotonic() - t0
        self._events.put(CheckpointEvent("snapshot", snap.step, now(), seconds=self.last_write_s))
        return final

    def report_failure(self, step: int, message: str) -> None:
        self._events.fault(step, FaultReason.MEMORY_SNAPSHOT_FAILED, message)

    def _meta(self, snap: Snapshot, files: dict[str, Any]) -> dict[str, Any]:
        return {
            "step": snap.step,
            "nonce": snap.nonce,
            "worldSize": self.world_size,
            "rank": self.rank,
            "time": now().isoformat(),
            "files": files,
            "extra": snap.extra,
        }

    def _drop(self, path: str) -> None:
        """Delete a snapshot (or a partial), its mapping first."""
        if self.ring is not None:
            self.ring.forget(self.slot_file(path))
        remove_local(path)

    def _recycle(self, partial: str) -> None:
        """Make `partial`, reusing the oldest snapshot that is pruned after this one commits: its
        rename uncommits it, and its file is overwritten in place. Else a new directory."""
        with self.lock:
            protected = {os.path.basename(p) for p in self.protected() if p}
            old = [local_name(s, n) for s, n in self.snapshots()[self.keep - 1 :]]
            old = [n for n in old if n not in protected]
            if not old:
                os.makedirs(partial, exist_ok=True)
                return
            os.rename(os.path.join(self.dir, old[-1]), partial)
        os.unlink(os.path.join(partial, LOCAL_META))
        bin_path = os.path.join(partial, shard_bin(self.rank))
        with contextlib.suppress(FileNotFoundError):
            os.replace(bin_path, f"{bin_path}.tmp")  # write_shard overwrites a .tmp in place

    def prune(self, protect: str | None, *, committed: bool = True) -> None:
        """Keep the newest `keep` snapshots (and the protected ones); drop the rest (with
        committed=False: keep every committed one) and any partial or half-deleted leftovers
        (only this rank's writer writes here). With a ring, a dropped snapshot becomes a spare
        slot while the ring holds fewer than keep + 1."""
        with self.lock:
            snaps = self.snapshots()
            keep = {local_name(s, n) for s, n in (snaps[: self.keep] if committed else snaps)}
            keep |= {os.path.basename(p) for p in (protect, *self.protected()) if p}
            try:
                names = sorted(os.listdir(self.dir))
            except FileNotFoundError:
                return
            slots = len(keep) + sum(n.startswith(SPARE_PREFIX) for n in names)
            for n in names:
                if n in keep or n.startswith(SPARE_PREFIX) or n == GPU_STAGING_OFF:
                    continue
                path = os.path.join(self.dir, n)
                with contextlib.suppress(OSError):
                    if self.ring is not None and slots < self.keep + 1 and is_local_name(n):
                        self._to_spare(path, slots)
                        slots += 1
                    else:
                        self._drop(path)

    def _to_spare(self, path: str, k: int) -> None:
        """A snapshot no longer kept becomes spare slot `k`: uncommitted by one rename (a spare's name is
        no snapshot's), then its metadata and index go; its file and mapping stay. In that order, a
        kill at any point leaves either a committed snapshot with its metadata or a spare, never a
        committed name without metadata."""
        spare = os.path.join(self.dir, f"{SPARE_PREFIX}{k}")
        while os.path.exists(spare):
            k += 1
            spare = os.path.join(self.dir, f"{SPARE_PREFIX}{k}")
        os.rename(path, spare)
        os.unlink(os.path.join(spare, LOCAL_META))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(spare, shard_idx(self.rank)))

    def drop_after(self, step: int) -> None:
        """Delete the snapshots newer than `step`: a timeline that was abandoned at a resume."""
        for s, n in self.snapshots():
            if s > step:
                with contextlib.suppress(OSError):
                    remove_local(self.path(s, n))

    # --- reading -------------------------------------------------------------------------------------
    def _manifest(self, step: int, nonce: int) -> tuple[str, Manifest]:
        snap_dir = self.path(step, nonce)
        meta = read_local_meta(snap_dir)
        if (meta["step"], meta["nonce"], meta["rank"]) != (step, nonce, self.rank):
            raise CheckpointError(f"{snap_dir}: its metadata names another snapshot")
        if meta["worldSize"] != self.world_size:
            raise CheckpointError(f"{snap_dir}: written by {meta['worldSize']} ranks")
        manifest = Manifest(
            step, nonce, self.world_size, meta["time"], {self.rank: meta["files"]}, meta["extra"]
        )
        return snap_dir, manifest

    def prefetch_newest(self, device: int) -> tuple[int, int] | None:
        """Begin copying this rank's newest committed snapshot to GPU `device` in the background
        (`DeviceStage.prefetch`), for `read` to find there if the ranks resume from it; its
        (step, nonce), or None when there is none or no GPU staging. A new rank process calls it
        before its process group is up: the ranks' agreement comes later."""
        if self.device is None or self.ring is None:
            return None
        for step, nonce in self.snapshots()[:1]:
            try:
                _manifest, _index, path, whole = self._mapped_slot(step, nonce)
            except (CheckpointError, OSError, KeyError, ValueError) as e:
                log.info("no prefetch of memory snapshot %d: %r", step, e)
                return None
            self.device.prefetch((path, whole.numel(), device), whole, device)
            return step, nonce
        return None

    def _mapped_slot(self, step: int, nonce: int) -> tuple[Manifest, ShardIndex, str, torch.Tensor]:
        """(manifest, index, slot file, its bytes mapped) of this rank's ring snapshot (step, nonce)."""
        assert self.ring is not None
        snap_dir, manifest = self._manifest(step, nonce)
        index, size = read_index(snap_dir, self.rank, manifest)
        path = self.slot_file(snap_dir)
        return manifest, index, path, self.ring.mapped(path, size)

    def read(self, step: int, nonce: int) -> Shard:
        """This rank's snapshot (step, nonce), its tensors mapped from the file (raises
        CheckpointError, OSError)."""
        if self.ring is None:
            snap_dir, manifest = self._manifest(step, nonce)
            return manifest, read_shard(snap_dir, self.rank, manifest)
        manifest, index, path, whole = self._mapped_slot(step, nonce)
        size = whole.numel()
        if self.device is not None and self.device.ops.active():  # the state lives on the GPU
            try:
                device = self.device.ops.current_device()
                on_gpu = self.device.load(whole, device, key=(path, size, device))
            except RuntimeError as e:  # CUDA refused it: tensor by tensor from the mapped file
                log.warning("memory snapshot of step %d loaded without GPU staging: %r", step, e)
                on_gpu = None
            if on_gpu is not None:  # loaded device-to-device from it; dropped after the load
                whole = on_gpu
        return manifest, (shard_state(index), view_shard(whole, index, size, path))
