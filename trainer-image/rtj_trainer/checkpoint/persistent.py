"""The persistent tier: shards written under `root` (the checkpoint volume) and committed across ranks.

Commit, with no collective in the background (layout in `checkpoint_format`):
1. each rank's writer writes `step-<N>.<nonce>.partial/rank-<r>.{bin,idx}` (tmp + fsync + rename)
   and then its done marker;
2. rank 0's writer waits for all markers, writes `manifest.json` (sizes + CRC32 of every file,
   fsynced) and renames the directory to `step-<N>`, fsyncs the parent, deletes checkpoints
   beyond the last `keep` and stale partials.
A crash at any point leaves every earlier `step-<N>` intact; a partial is never loaded. The other
ranks learn of the commit by seeing `step-<N>` appear (`poll_commit`). A write error (ENOSPC, EIO)
removes the rank's partial files and is reported as a fault.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import torch
from rtj.contract import FaultReason

from ..checkpoint_format import (
    MANIFEST,
    Manifest,
    WorldSizeMismatch,
    any_failed,
    committed_name,
    committed_steps,
    fsync_dir,
    partial_name,
    read_done_marker,
    remove_tree,
    shard_bin,
    shard_idx,
    stale_entries,
    write_done_marker,
    write_failed_marker,
    write_file_atomic,
)
from .events import CheckpointEvent, EventLog, now
from .shard_io import Aborted, FileSums, WriteControl, copy_shard_in_child, read_shard

log = logging.getLogger(__name__)

Shard = tuple[Manifest, tuple[Any, list[torch.Tensor]]]


class Abandoned(Exception):
    """The commit cannot happen (a rank failed, or not all wrote in time); the partial is dropped."""


class PersistentTier:
    def __init__(
        self,
        root: str,
        *,
        rank: int,
        world_size: int,
        keep: int,
        commit_timeout_s: float,
        control: WriteControl,
        events: EventLog,
        clean_stale: bool = True,
    ) -> None:
        """`clean_stale` False: leave other writers' partials alone at the start (a pod's entrypoint
        finishing an emergency persist while other pods write theirs: `checkpoint.handoff`)."""
        self.root = root
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.commit_timeout_s = commit_timeout_s
        self._control = control
        self._events = events
        self.awaiting_commit: int | None = None  # ranks > 0: the step whose commit they wait to see
        self._last_commit_poll = 0.0
        #: Persisting a memory snapshot (`persist_in_background`): the thread, and the snapshot it
        #: reads (kept from pruning and recycling meanwhile).
        self.persister: threading.Thread | None = None
        self.persist_source: str | None = None
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:  # the volume is unreadable now: resume from memory, persist later
            log.warning("checkpoint root %s is not usable: %r", self.root, e)
        #: Rank 0's removal of the leftovers of crashes it found at its start, in the background: a
        #: persist SIGKILLed with its rank leaves a partial of the whole shard, and deleting that
        #: waited on the disk for 1.85 s in a restarting rank (1xH100, before its process group).
        self.cleaner: threading.Thread | None = None
        if rank == 0 and clean_stale:
            self.cleaner = self._remove_in_background(stale_entries(self.root, None))

    @property
    def persisting(self) -> bool:
        """A persist of a memory snapshot is in flight."""
        return self.persister is not None and self.persister.is_alive()

    # --- writing -----------------------------------------------------------------------------------
    def persist(
        self, step: int, nonce: int, extra: dict[str, Any], produce: Callable[[str], FileSums]
    ) -> None:
        """Write this rank's shard into root's partial of (step, nonce) with `produce`, mark it
        done, and (rank 0) commit; every failure is reported and leaves no partial of this rank."""
        partial = os.path.join(self.root, partial_name(step, nonce))
        mine = [os.path.join(partial, n) for n in (shard_bin(self.rank), shard_idx(self.rank))]
        t0 = time.monotonic()
        try:
            os.makedirs(partial, exist_ok=True)
            files = produce(partial)
            write_done_marker(partial, self.rank, files)
            self._events.put(CheckpointEvent("persisted", step, now(), seconds=time.monotonic() - t0))
            if self.rank == 0:
                self._commit(step, nonce, extra, partial)
            else:
                self.awaiting_commit = step
        except Aborted:
            self._drop(partial, mine)
        except Abandoned as e:
            self._drop(partial, mine)
            self._events.fault(step, FaultReason.CHECKPOINT_COMMIT_ABANDONED, str(e))
        except OSError as e:
            reason = (
                FaultReason.CHECKPOINT_STORAGE_FULL
                if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else FaultReason.CHECKPOINT_WRITE_FAILED
            )
            write_failed_marker(partial, self.rank, f"{reason}: {e}")
            self._drop(partial, mine)
            self._events.fault(step, reason, f"checkpoint of step {step} not written: {e}")
        except Exception as e:
            write_failed_marker(partial, self.rank, f"{FaultReason.CHECKPOINT_WRITE_FAILED}: {e!r}")
            self._drop(partial, mine)
            self._events.fault(
                step, FaultReason.CHECKPOINT_WRITE_FAILED, f"checkpoint of step {step} failed: {e!r}"
            )

    def persist_in_background(self, step: int, nonce: int, extra: dict[str, Any], src: str) -> None:
        """Persist the committed memory snapshot `src`: the persister thread copies it in a child
        process (`checkpoint_copy.copy_shard_in_child`: off the rank's GIL) and commits it."""
        self.persist_source = src
        self.persister = threading.Thread(
            target=self._persist_local,
            args=(step, nonce, extra, src),
            name=f"rtj-ckpt-persister-{step}",
            daemon=True,
        )
        self.persister.start()

    def _persist_local(self, step: int, nonce: int, extra: dict[str, Any], src: str) -> None:
        try:

            def copy(partial: str) -> FileSums:
                return copy_shard_in_child(src, partial, self.rank, self._control)

            self.persist(step, nonce, extra, copy)
        finally:
            self.persist_source = None

    def _drop(self, partial: str, mine: list[str]) -> None:
        for p in mine:
            for q in (p, f"{p}.tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(q)
        if self.rank == 0:
            remove_tree(partial)

    def _commit(self, step: int, nonce: int, extra: dict[str, Any], partial: str) -> None:
        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            ranks = {r: read_done_marker(partial, r) for r in range(self.world_size)}
            if all(v is not None for v in ranks.values()):
                break
            if any_failed(partial, self.world_size):
                raise Abandoned(f"a rank failed to write its shard of step {step}")
            if time.monotonic() > deadline:
                raise Abandoned(f"not all ranks wrote step {step} within {self.commit_timeout_s} s")
            if self._control.abort.wait(0.01):
                raise Aborted
        when = now()
        manifest = Manifest(step, nonce, self.world_size, when.isoformat(), ranks, extra)  # type: ignore[arg-type]
        write_file_atomic(os.path.join(partial, MANIFEST), manifest.to_bytes())
        final = os.path.join(self.root, committed_name(step))
        if os.path.isdir(final):
            # The same step was committed before a restart; never replace committed data.
            remove_tree(partial)
        else:
            os.rename(partial, final)
            fsync_dir(self.root)
        self._events.put(CheckpointEvent("committed", step, when))
        for old in committed_steps(self.root)[self.keep :]:
            with contextlib.suppress(OSError):
                remove_tree(os.path.join(self.root, committed_name(old)))
        self.cleanup_stale()

    def cleanup_stale(self) -> None:
        """Remove partial and trash directories (rank 0: leftovers of crashes or of a commit)."""
        remove_all(stale_entries(self.root, None))

    @staticmethod
    def _remove_in_background(paths: list[str]) -> threading.Thread | None:
        """Delete `paths` (listed by the caller, so nothing written after is touched) in a thread."""
        if not paths:
            return None
        thread = threading.Thread(target=remove_all, args=(paths,), name="rtj-ckpt-cleanup", daemon=True)
        thread.start()
        return thread

    # --- seeing commits (ranks > 0) ------------------------------------------------------------------
    def poll_commit(self) -> None:
        """A rank > 0 learns of rank 0's commit by seeing `step-<N>` appear (checked every 0.5 s)."""
        if self.awaiting_commit is None or self.rank == 0:
            return
        t = time.monotonic()
        if t - self._last_commit_poll < 0.5:
            return
        self._last_commit_poll = t
        step = self.awaiting_commit
        if os.path.isdir(os.path.join(self.root, committed_name(step))):
            self.awaiting_commit = None
            self._events.put(CheckpointEvent("committed", step, now()))

    def wait_commit(self, deadline: float) -> None:
        """Until the awaited commit appears or `deadline` (monotonic); the next poll looks at once."""
        if self.rank == 0 or self.awaiting_commit is None:
            return
        step = self.awaiting_commit
        while time.monotonic() < deadline:
            if os.path.isdir(os.path.join(self.root, committed_name(step))):
                break
            time.sleep(0.02)
        self._last_commit_poll = 0.0

    # --- reading -------------------------------------------------------------------------------------
    def steps(self) -> list[int]:
        return committed_steps(self.root)

    def read(self, step: int) -> Shard:
        """This rank's shard of committed `step`, checked (raises CheckpointError, OSError)."""
        ckpt_dir = os.path.join(self.root, committed_name(step))
        manifest = Manifest.read(ckpt_dir)
        if manifest.world_size != self.world_size:
            # Never fall back silently: a fresh start would prune the job's real checkpoints.
            raise WorldSizeMismatch(
                f"{ckpt_dir} was written by {manifest.world_size} ranks, this job has "
                f"{self.world_size}; resuming on another world size is not supported"
            )
        return manifest, read_shard(ckpt_dir, self.rank, manifest)

    def committed_time(self, step: int) -> datetime:
        """When `step` was committed (its manifest's time; raises CheckpointError, ValueError)."""
        return datetime.fromisoformat(Manifest.read(os.path.join(self.root, committed_name(step))).time)


def remove_all(paths: list[str]) -> None:
    """`remove_tree` each of `paths`; one that cannot be removed is left (the next start tries again)."""
    for path in paths:
        with contextlib.suppress(OSError):
            remove_tree(path)
