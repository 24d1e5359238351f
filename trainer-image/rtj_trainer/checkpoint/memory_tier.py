"""The node-local memory tier: this rank's snapshots in a tmpfs (the pod's /dev/shm), one rename each.

    <local_root>/rank-<r>/step-<N>.<nonce>/          committed (layout in `checkpoint_format`)
    <local_root>/rank-<r>/step-<N>.<nonce>.partial/  being written, or torn by a kill: never loaded

Each snapshot, once in host memory, is written here by the writer thread and committed by this rank
alone; which step the ranks resume from is agreed at load (`resume`). The oldest snapshot that is
pruned after a new one commits is recycled for it: overwriting its file in place skips the page
allocation of a new tmpfs file (3-4x the write time measured). Snapshots being persisted, being
replicated, or replicated last are `protected` (the owner says which) and never pruned nor recycled.

Snapshots at copy speed fit inside this part, keeping the layout above. The recycled snapshots
already form a ring of `keep` files reused in place; to make one device-to-host copy land straight
in them, this class becomes the staging's `HostBuffers` (`staging.HostBuffers`):
- at a save, the training thread uncommits the ring slot to reuse (`_recycle`: one rename, the
  same choice as today, never a protected slot; none free = busy, the snapshot waits) and asks for
  its buffers: views of its `.bin` mapped shared (`torch.from_file(shared=True)`), registered once
  with CUDA as pinned memory (`torch.cuda.cudart().cudaHostRegister`; nothing on CPU) and kept
  mapped across renames, so pages are faulted in once and never allocated again;
- the writer thread then only waits for the copy's event and commits: `snapshot.json` with the
  step, the nonce and a CRC32 of the layout (each tensor's dtype, shape, offset), then the rename;
  a kill before the rename leaves a `.partial`, never a committed slot over torn bytes;
- `read` checks the layout CRC32 against the index and maps the file (as today); the copy into the
  live tensors is then host-to-device from registered memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable

from rtj.contract import FaultReason

from ..checkpoint_format import (
    LOCAL_META,
    CheckpointError,
    Manifest,
    local_name,
    local_rank_dir,
    local_snapshots,
    read_local_meta,
    remove_local,
    shard_bin,
    write_local_meta,
)
from .events import CheckpointEvent, EventLog, now
from .persistent import Shard
from .shard_io import WriteControl, read_shard, write_shard
from .staging import Snapshot


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
        os.makedirs(self.dir, exist_ok=True)
        # Only the partials a killed predecessor left: its committed snapshots are the candidates
        # of the resume (a lost peer's replica may be of an older one than the newest two).
        self.prune(protect=None, committed=False)

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
            meta = {
                "step": snap.step,
                "nonce": snap.nonce,
                "worldSize": self.world_size,
                "rank": self.rank,
                "time": now().isoformat(),
                "files": files,
                "extra": snap.extra,
            }
            write_local_meta(partial, meta)
            os.rename(partial, final)
        except Exception as e:
            shutil.rmtree(partial, ignore_errors=True)
            msg = f"memory snapshot of step {snap.step} not written: {e!r}"
            self._events.fault(snap.step, FaultReason.MEMORY_SNAPSHOT_FAILED, msg)
            return None
        self._events.put(CheckpointEvent("snapshot", snap.step, now(), seconds=seconds))
        return final

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
        (only this rank's writer writes here)."""
        with self.lock:
            snaps = self.snapshots()
            keep = {local_name(s, n) for s, n in (snaps[: self.keep] if committed else snaps)}
            keep |= {os.path.basename(p) for p in (protect, *self.protected()) if p}
            try:
                names = os.listdir(self.dir)
            except FileNotFoundError:
                return
            for n in names:
                if n not in keep:
                    with contextlib.suppress(OSError):
                        remove_local(os.path.join(self.dir, n))

    def drop_after(self, step: int) -> None:
        """Delete the snapshots newer than `step`: a timeline that was abandoned at a resume."""
        for s, n in self.snapshots():
            if s > step:
                with contextlib.suppress(OSError):
                    remove_local(self.path(s, n))

    # --- reading -------------------------------------------------------------------------------------
    def read(self, step: int, nonce: int) -> Shard:
        """This rank's snapshot (step, nonce), its tensors mapped from the file (raises
        CheckpointError, OSError)."""
        snap_dir = self.path(step, nonce)
        meta = read_local_meta(snap_dir)
        if (meta["step"], meta["nonce"], meta["rank"]) != (step, nonce, self.rank):
            raise CheckpointError(f"{snap_dir}: its metadata names another snapshot")
        if meta["worldSize"] != self.world_size:
            raise CheckpointError(f"{snap_dir}: written by {meta['worldSize']} ranks")
        manifest = Manifest(
            step, nonce, self.world_size, meta["time"], {self.rank: meta["files"]}, meta["extra"]
        )
        return manifest, read_shard(snap_dir, self.rank, manifest)
