"""Asynchronous checkpoints with an atomic cross-rank commit that never stall training on storage.

What training waits for (the stall) is only a snapshot of the rank's state into host memory:
model + optimizer local shards (FSDP2 DTensors are saved as their local tensors) copied into
reused, pinned host buffers on a side CUDA stream (a plain copy on CPU). The training stream is
made to wait for that copy only right before the next `optimizer.step()` (an optimizer pre-hook),
so on GPU the copy overlaps the next forward/backward. A background thread then writes the files
and commits; training never joins it.

Commit, with no collective in the background (layout in `checkpoint_format`):
1. at a due step all ranks agree, with one tiny all-reduce on a CPU (gloo) group in the training
   loop, whether to save (nobody's previous save is still draining) and on a nonce naming the save;
2. each rank's writer writes `step-<N>.<nonce>.partial/rank-<r>.{bin,idx}` (tmp + fsync + rename)
   and then its done marker;
3. rank 0's writer waits for all markers, writes `manifest.json` (sizes + CRC32 of every file,
   fsynced) and renames the directory to `step-<N>`, fsyncs the parent, deletes checkpoints
   beyond the last `keep` and stale partials.
A crash at any point leaves every earlier `step-<N>` intact; a partial is never loaded.

Commits are reported from the training thread (`poll()`, called by `maybe_save`): rank 0 learns
it from its writer, the other ranks by seeing `step-<N>` appear. `RankReporter.checkpoint_committed`
then updates the pod's heartbeat and writes NVRx's checkpoint iteration file (RankEnv's
`progress_file`, read by ft_launcher's no-progress detection) on each pod's local rank 0; a resume
reports the checkpoint it loaded the same way.

If a save is due while the previous one is still being written, the save is skipped, reported
(`RankReporter.checkpoint_skipped`) and coalesced: the next step at which every writer is idle
saves instead, so a slow store costs recency, never training time. A write error (ENOSPC, EIO)
removes the rank's partial files, reports a fault and training continues.

Why not torch DCP or NVRx async checkpointing (measured on 2xH200 on 2026-11-30, FSDP2 with 6.85 GB
of state per rank; docs/benchmarks.md, "Checkpoint stall"): DCP `save` blocks for the whole write
(11-14 s per save); DCP `async_save` still stalls 5.2 s (planning collectives + unpinned staging copy)
and 10-12 s when the previous save has not finished, because it waits for it. NVRx 0.4.1's persistent
async queue saved wrong data on CPU (a race); the NVRx 0.7 stock path hung on FSDP2 and its
worker processes outlived crashed ranks. A thread in the rank cannot be orphaned, needs no
pickling of the state, and the skip/coalesce rule bounds what training ever waits for by the copy.
Resume needs the same world size (each rank reads its own shard); that is checked and refused
with a clear error otherwise.

The node-local memory tier (`local_root`, a tmpfs such as the pod's /dev/shm, and its own
`local_interval_steps`): each snapshot, once in host memory, is also written by the background
writer into `local_root` and committed there by each rank with one rename (memory speed; layout
in `checkpoint_format`). Persistence then copies a committed local snapshot to `root` in a second
background thread (the persister), so a slow store never holds up the memory tier: snapshots go
on every `local_interval_steps` while a persist is draining, and a persist due while the previous
one drains is skipped and coalesced as before. An in-job restart (same pod, same /dev/shm)
resumes from the newest step that every rank can load, local or persistent (`load_latest`).
A memory snapshot due while the previous one is still being written is taken at the first step
after it; with `adapt_local_interval` the interval widens to a multiple of the configured one that
the measured write fits in (`snapshot_every`), so snapshots are on schedule rather than late.
NVRx 0.7's `checkpointing.local.LocalCheckpointManager` was read and not used: its
BasicTensorAwareStateDict requires CUDA tensors (our CPU path and tests), it allocates new CPU
copies per save instead of reusing pinned buffers, stores each shard with `torch.save` and loads it
with `torch.load(weights_only=False)` (unpickling code) without checksums, and its async save
needs the AsyncCallsQueue that hung on FSDP2 (FACTS.md).

The peer replica (`peer_endpoint`, rtj_trainer.peer_replica): each memory snapshot this rank
commits is streamed, by a background thread, to the replica server of another pod (coalesced: the
newest wins; the snapshot being streamed is neither pruned nor recycled meanwhile). At resume the
ranks also offer the replicas their pod holds (`replica_endpoint`): a rank that lacks its own
snapshot of a candidate (a replacement pod, memory lost with the node) fetches it from the holder
into its memory tier and loads it like its own (source "peer").

`emergency_save` (SIGTERM, a graceful stop): the in-flight persist of an older step is abandoned,
the current step is snapshotted and persisted at once, and the call returns when it committed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import queue
import random
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import torch
from rtj.contract import FaultReason, FaultSeverity

from .checkpoint_format import (
    CHUNK_BYTES,
    LOCAL_META,
    MANIFEST,
    CheckpointError,
    Manifest,
    ShardIndex,
    TensorEntry,
    WorldSizeMismatch,
    any_failed,
    committed_name,
    committed_steps,
    crc32_of,
    fsync_dir,
    local_name,
    local_rank_dir,
    local_snapshots,
    partial_name,
    read_done_marker,
    read_local_meta,
    ref_index,
    remove_local,
    remove_tree,
    shard_bin,
    shard_idx,
    stale_entries,
    tensor_ref,
    write_done_marker,
    write_failed_marker,
    write_file_atomic,
    write_local_meta,
)
from .peer_replica import Offer, ReplicaError, Replicator, fetch_snapshot, held_replicas

log = logging.getLogger(__name__)

__all__ = ["CheckpointError", "CheckpointManager", "Resumed", "latest_committed"]

#: Threads copying a memory snapshot from the pinned buffer into the memory tier. 1 until
#: bench/snapshot_write_threads.py shows a gain on a GPU node (on the 2-core CPU machine under
#: load, 4 threads measured 0.63x in one run and 1.48x in the next: inconclusive).
DEFAULT_LOCAL_WRITE_THREADS = 1
SOURCE_LOCAL = "local"
SOURCE_PERSISTENT = "persistent"
#: A memory snapshot fetched from the pod holding this rank's replica (rtj_trainer.peer_replica).
SOURCE_PEER = "peer"


class Reporter(Protocol):
    """The part of `rtj_trainer.report.RankReporter` used here."""

    def checkpoint_committed(self, step: int, when: datetime | None = None) -> None: ...
    def checkpoint_skipped(self) -> None: ...
    def memory_snapshot(self, step: int) -> None: ...
    def replicated(self, step: int) -> None: ...
    def persisted(self, seconds: float) -> None: ...
    def fault(self, severity: Any, reason: str, message: str = "") -> None: ...


#: A memory snapshot's interval leaves this margin over the measured write time (writes vary).
SNAPSHOT_WRITE_MARGIN = 1.5
#: The memory tier's interval grows to at most this many times the configured one.
MAX_SNAPSHOT_WIDENING = 64


def snapshot_every(configured: int, write_s: float, step_s: float) -> int:
    """The memory tier's interval in steps: the configured one, or the smallest multiple of it that
    a snapshot write (with SNAPSHOT_WRITE_MARGIN) fits in, so a due snapshot does not wait for the
    previous one to be written (taken late) and the steps a restart loses stay within one interval."""
    if write_s <= 0 or step_s <= 0:
        return configured
    factor = math.ceil(SNAPSHOT_WRITE_MARGIN * write_s / step_s / configured)
    return configured * min(MAX_SNAPSHOT_WIDENING, max(1, factor))


@dataclass(frozen=True)
class CheckpointEvent:
    #: "committed" | "skipped" | "fault" | "snapshot" (a local memory snapshot) | "persisted" |
    #: "replicated" (the peer committed its replica of this rank's memory snapshot)
    kind: str
    step: int
    time: datetime
    reason: str = ""
    message: str = ""
    #: "persisted": seconds this rank took to write its shard to the volume (before the commit);
    #: "snapshot" (a new one, not a resume): seconds its write into the memory tier took;
    #: "replicated": seconds the stream to the peer took.
    seconds: float | None = None


@dataclass(frozen=True)
class Resumed:
    step: int
    extra: dict[str, Any]
    #: SOURCE_LOCAL (the node-local memory tier), SOURCE_PEER (memory snapshots, one rank's at least
    #: fetched from the pod holding its replica) or SOURCE_PERSISTENT (root).
    source: str = SOURCE_PERSISTENT


@dataclass
class _Snapshot:
    step: int
    nonce: int
    skeleton: Any
    host: list[torch.Tensor]
    ready: Any  # torch.cuda.Event or None
    extra: dict[str, Any] = field(default_factory=dict)
    #: Offered to the peer replica: decided by all ranks together (see `save`).
    replicate: bool = False


class _Aborted(Exception):
    pass


class _Abandoned(Exception):
    pass


def _flatten(obj: Any, out: list[torch.Tensor], path: str = "") -> Any:
    """The skeleton of a state tree, appending its tensors (local shards of DTensors) to `out`."""
    if isinstance(obj, torch.Tensor):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        out.append(local.detach())
        return tensor_ref(len(out) - 1)
    if isinstance(obj, dict):
        return {k: _flatten(v, out, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [_flatten(v, out, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, out, f"{path}[{i}]") for i, v in enumerate(obj))
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot checkpoint {type(obj).__name__} at {path or '<root>'}")


def _unflatten(skel: Any, current: Any, loaded: list[torch.Tensor], mapped: bool = False) -> Any:
    """The saved tree with every tensor placed like the `current` one at the same path.

    A DTensor in `current` receives the saved local shard in place (so mesh and placements are the
    live ones); a plain tensor is copied into or moved to the current tensor's device. `mapped`:
    `loaded` are views of a snapshot file (`_map_shard`), so a tensor with no current one to be
    copied into is copied out of the file (the file is rewritten in place by a later snapshot).
    """
    idx = ref_index(skel)
    if idx is not None:
        saved = loaded[idx]
        if isinstance(current, torch.Tensor):
            local = current.to_local() if hasattr(current, "to_local") else current
            if tuple(local.shape) != tuple(saved.shape) or local.dtype != saved.dtype:
                raise CheckpointError(
                    f"saved tensor {tuple(saved.shape)}/{saved.dtype} does not fit the model's "
                    f"{tuple(local.shape)}/{local.dtype}"
                )
            local.copy_(saved)
            return current
        return saved.clone() if mapped else saved
    if isinstance(skel, dict):
        cur = current if isinstance(current, dict) else {}
        return {k: _unflatten(v, cur.get(k), loaded, mapped) for k, v in skel.items()}
    if isinstance(skel, list | tuple):
        cur = (
            current if isinstance(current, list | tuple) and len(current) == len(skel) else [None] * len(skel)
        )
        items = [_unflatten(v, c, loaded, mapped) for v, c in zip(skel, cur, strict=True)]
        return items if isinstance(skel, list) else tuple(items)
    return skel


def _state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model), "optim": None}
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd}


def _as_bytes(t: torch.Tensor) -> memoryview:
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in checkpoint")
    return dt


class CheckpointManager:
    """One per rank process; survives in-process restarts (call `set_group` after each re-entry).

    Training loop::

        ckpt = CheckpointManager(env.checkpoint_dir, rank=r, world_size=w, interval_steps=100,
                                 keep=2, group=gloo_group, reporter=RankReporter.from_env())
        resumed = ckpt.load_latest(model, optim)        # None on a fresh start
        for step in range(start, steps):
            ... loss.backward(); optim.step() ...
            ckpt.maybe_save(step + 1, model, optim, extra={"seed": 1})
        ckpt.close()
    """

    def __init__(
        self,
        root: str,
        *,
        rank: int,
        world_size: int,
        interval_steps: int,
        keep: int = 2,
        group: Any = None,
        reporter: Reporter | None = None,
        commit_timeout_s: float = 600.0,
        write_bytes_per_s: float | None = None,
        on_event: Callable[[CheckpointEvent], None] | None = None,
        local_root: str | None = None,
        local_interval_steps: int | None = None,
        local_keep: int = 2,
        local_write_threads: int = DEFAULT_LOCAL_WRITE_THREADS,
        adapt_local_interval: bool = False,
        peer_endpoint: str | None = None,
        replica_endpoint: str | None = None,
    ) -> None:
        if interval_steps < 1 or keep < 1 or local_keep < 1 or local_write_threads < 1:
            raise ValueError("interval_steps, keep, local_keep and local_write_threads must be >= 1")
        if local_root is not None and (local_interval_steps or 0) < 1:
            raise ValueError("local_interval_steps must be >= 1 with a local_root")
        self.root = os.path.abspath(root)
        self.rank = rank
        self.world_size = world_size
        self.interval_steps = interval_steps
        self.keep = keep
        self.commit_timeout_s = commit_timeout_s
        #: Throttle for tests and benchmarks ("storage slower than the interval").
        self.write_bytes_per_s = write_bytes_per_s
        self._group = group
        self._reporter = reporter
        self._on_event = on_event
        self._events: queue.SimpleQueue[CheckpointEvent] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._preparer: threading.Thread | None = None  # allocating the pinned host buffers
        self._abort = threading.Event()
        self._pending = False
        self._host: list[torch.Tensor] = []
        self._stream: Any = None
        self._fence_event: Any = None
        self._copy_events: tuple[Any, Any] | None = None
        self._hooked: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._awaiting_commit: int | None = None
        self._last_commit_poll = 0.0
        self.last_committed: int | None = None
        #: The memory tier: one directory per rank under local_root (None: off).
        self.local_root = os.path.abspath(local_root) if local_root else None
        self.local_interval_steps = local_interval_steps or 0
        self.local_keep = local_keep
        self.local_write_threads = local_write_threads
        #: The memory tier's interval in effect: local_interval_steps, or with adapt_local_interval
        #: the one the measured write fits in (snapshot_every), agreed by the ranks at each save.
        self.adapt_local_interval = adapt_local_interval
        self.local_every = self.local_interval_steps
        self._last_write_s = 0.0  # this rank's last memory-tier write
        self._step_s = 0.0  # this rank's step time (moving average of the maybe_save cadence)
        self._last_call: float | None = None
        self._pending_local = False
        self._persister: threading.Thread | None = None
        self._persist_source: str | None = None
        self.last_local: int | None = None
        #: Whether the last `save` that went ahead also persists (else: memory tier only).
        self.last_save_persists = False
        self.saves_started = 0
        self.saves_skipped = 0
        self.last_snapshot_s = 0.0
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:  # the volume is unreadable now: resume from memory, persist later
            log.warning("checkpoint root %s is not usable: %r", self.root, e)
        if rank == 0:
            self._cleanup_stale(keep_partial=None)
        #: The peer replica (rtj_trainer.peer_replica): this rank's memory snapshots are streamed to
        #: the server at peer_endpoint; replica_endpoint is this pod's own server (the replicas it
        #: holds for other ranks, offered at resume). Both need the memory tier.
        self.replica_endpoint = replica_endpoint if self.local_root is not None else None
        self._replicator: Replicator | None = None
        self._replica_source: str | None = None
        #: The newest snapshot whose replica the peer committed: kept, so that a survivor still
        #: holds the step a lost pod's replica is of (the ranks replicate the same steps).
        self._replicated_source: str | None = None
        self._local_lock = threading.Lock()  # the replicator's protected snapshot vs. pruning/recycling
        self._peer_holders: dict[tuple[int, int], str] = {}
        self.last_replicated: int | None = None
        self.replicate_failures = 0
        if self.local_root is not None:
            self._local_dir = local_rank_dir(self.local_root, rank)
            os.makedirs(self._local_dir, exist_ok=True)
            # Only the partials a killed predecessor left: its committed snapshots are the candidates
            # of the resume (a lost peer's replica may be of an older one than the newest two).
            self._prune_local(protect=None, committed=False)
            if peer_endpoint:
                self._replicator = Replicator(peer_endpoint, rank, self._protect_replica, self._replicated)

    # --- the training-loop API ----------------------------------------------------------------
    def set_group(self, group: Any) -> None:
        """The CPU (gloo) process group used to agree on saves; renew after an in-process restart."""
        self._group = group

    @property
    def busy(self) -> bool:
        """The host buffers are still being written out (a new snapshot must wait)."""
        return any(t is not None and t.is_alive() for t in (self._writer, self._preparer))

    @property
    def persisting(self) -> bool:
        """A persist to `root` is in flight."""
        if self.local_root is None:
            return self.busy
        return self._persister is not None and self._persister.is_alive()

    def is_due(self, step: int) -> bool:
        if self._pending or step % self.interval_steps == 0:
            return True
        return self.local_root is not None and (self._pending_local or step % self.local_every == 0)

    def maybe_save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """Call after every completed step: "saved" (persisting), "snapshot" (memory tier only),
        "skipped" or "" (not due). Never blocks on I/O.

        Every rank must call it at the same steps (it holds the agreement collective when due).
        """
        self.poll()
        now = time.monotonic()
        if self._last_call is not None:  # a step without a save in it (its stall is not a step)
            dt = now - self._last_call
            self._step_s = dt if self._step_s == 0 else 0.9 * self._step_s + 0.1 * dt
        self._last_call = now
        if not self.is_due(step):
            return ""
        self._last_call = None
        if not self.save(step, model, optimizer, extra):
            return "skipped"
        return "saved" if self.last_save_persists else "snapshot"

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
        *,
        force_persist: bool = False,
    ) -> bool:
        """Snapshot now (all ranks, same step); persist too when due. False: skipped (busy)."""
        persist_due = (
            force_persist or self.local_root is None or self._pending or step % self.interval_steps == 0
        )
        local_due = self.local_root is not None and (self._pending_local or step % self.local_every == 0)
        replicating = self._replicator is not None and self._replicator.busy
        any_busy, any_persisting, any_replicating, nonce, write_s, step_s = self._agree(
            busy=self.busy,
            persisting=self.persisting,
            replicating=replicating,
            write_s=self._last_write_s,
            step_s=self._step_s,
        )
        if self.local_root is not None and self.adapt_local_interval:  # the same agreed figures on every rank
            self.local_every = snapshot_every(self.local_interval_steps, write_s, step_s)
        persist = persist_due and not any_persisting and not any_busy
        if persist_due and not persist:
            if not self._pending or step % self.interval_steps == 0:
                self.saves_skipped += 1
                self._emit(CheckpointEvent("skipped", step, datetime.now(UTC), "PreviousSaveDraining"))
            self._pending = True
        if any_busy:
            self._pending_local = local_due
            return False
        if not persist and not local_due:
            return False  # only a coalesced persist was due, and the persister is still draining
        if persist:
            self._pending = False
        self._pending_local = False
        self.last_save_persists = persist
        t0 = time.perf_counter()
        tensors: list[torch.Tensor] = []
        skeleton = _flatten(_state_of(model, optimizer), tensors)
        host, ready = self._copy_to_host(tensors, optimizer)
        self.last_snapshot_s = time.perf_counter() - t0
        # Replicated only when no rank's replicator is busy: every rank offers the same steps, so a
        # lost pod's replicas are of a step the survivors hold too (coalescing per rank would not).
        replicate = self._replicator is not None and not any_replicating
        snap = _Snapshot(step, nonce, skeleton, host, ready, dict(extra or {}), replicate)
        self._abort.clear()
        if self.local_root is None:
            target, args = self._write, (snap,)
        else:
            target, args = self._write_local, (snap, persist)  # type: ignore[assignment]
        self._writer = threading.Thread(target=target, args=args, name=f"rtj-ckpt-writer-{step}", daemon=True)
        self._writer.start()
        self.saves_started += 1
        return True

    def emergency_save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> bool:
        """Snapshot and persist `step` now, on every rank (a graceful stop); True once committed.

        An in-flight persist of an older step is abandoned: the newest state replaces it.
        """
        deadline = time.monotonic() + (timeout if timeout is not None else self.commit_timeout_s)
        self.wait_local(max(0.0, deadline - time.monotonic()))
        self.abort_inflight(timeout=max(0.0, deadline - time.monotonic()))
        self._pending_local = self._pending = False
        if not self.save(step, model, optimizer, extra, force_persist=True):
            return False
        self.wait(max(0.0, deadline - time.monotonic()))
        return self.last_committed == step

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Allocate the pinned host buffers now, not inside the first save, and in the background:
        pinning 13.7 GB took 6-7 s of the first step after a restart on an H200 (issue 14). Until
        they are ready the manager is `busy`, so a save that falls due meanwhile waits for the
        next step, as it waits for a writer still running.

        Call after the first optimizer step: the optimizer state must exist.
        """
        tensors: list[torch.Tensor] = []
        _flatten(_state_of(model, optimizer), tensors)
        specs = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
        cuda = any(t.is_cuda for t in tensors)
        device = torch.cuda.current_device() if cuda else None

        def allocate() -> None:
            if device is not None:
                torch.cuda.set_device(device)
            for i, spec in enumerate(specs):
                self._host_buffer(i, spec, pin=cuda)

        self._preparer = threading.Thread(target=allocate, name="rtj-ckpt-prepare", daemon=True)
        self._preparer.start()

    def fence(self) -> None:
        """Make the current CUDA stream wait for the last snapshot copy (before mutating state).

        Registered as an optimizer step pre-hook by `save`; call it yourself before any other
        in-place change of parameters or optimizer state.
        """
        ev, self._fence_event = self._fence_event, None
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)

    def copy_seconds(self) -> float | None:
        """GPU time of the last snapshot's device-to-host copy, once it has finished (else None)."""
        if self._copy_events is None or not self._copy_events[1].query():
            return None
        start, end = self._copy_events
        return start.elapsed_time(end) / 1000.0

    def poll(self) -> list[CheckpointEvent]:
        """Report what the writer did (commits, faults) from the training thread; cheap."""
        if self._awaiting_commit is not None and self.rank != 0:
            now = time.monotonic()
            if now - self._last_commit_poll >= 0.5:
                self._last_commit_poll = now
                step = self._awaiting_commit
                if os.path.isdir(os.path.join(self.root, committed_name(step))):
                    self._awaiting_commit = None
                    self._events.put(CheckpointEvent("committed", step, datetime.now(UTC)))
        out: list[CheckpointEvent] = []
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                break
            out.append(ev)
            self._dispatch(ev)
        return out

    def wait_local(self, timeout: float | None = None) -> bool:
        """Wait for the writer only (the host buffers are free, a memory snapshot committed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in (self._preparer, self._writer):
            if t is not None:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.poll()
        return not self.busy

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight save (end of training, tests); True when none is left."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.commit_timeout_s)
        for attr in ("_preparer", "_writer", "_persister"):  # the writer may start the persister
            w = getattr(self, attr)
            if w is not None:
                w.join(max(0.0, deadline - time.monotonic()))
        if self.rank != 0 and self._awaiting_commit is not None:
            step = self._awaiting_commit
            while time.monotonic() < deadline:
                if os.path.isdir(os.path.join(self.root, committed_name(step))):
                    break
                time.sleep(0.02)
            self._last_commit_poll = 0.0
        self.poll()
        return not self.busy and not self.persisting

    def abort_inflight(self, timeout: float = 5.0) -> None:
        """Stop the in-flight save (its partial is dropped); used when the job is torn down."""
        self._abort.set()
        for w in (self._writer, self._persister):
            if w is not None:
                w.join(timeout)
        self._abort.clear()
        self.poll()

    def close(self, timeout: float | None = None) -> None:
        self.wait(timeout)

    # --- resume --------------------------------------------------------------------------------
    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> Resumed | None:
        """Load the newest step that every rank can read intact, local or persistent; None if none.

        The candidates are the same on every rank: memory snapshots that every rank can get with
        the same nonce (one save, never a mix of two), from its own memory tier or from the pod
        that holds its peer replica, and committed steps under root. Newest first
        (local before persistent for the same step), each rank reads its own shard, checking
        sizes and CRC32, and one MIN all-reduce says whether all could; a torn or corrupt shard
        anywhere moves every rank to the next candidate together. Resuming needs the world size
        the checkpoint was written with (checked). Local snapshots newer than the loaded step
        are deleted: they belong to a timeline that was abandoned.
        """
        local, persistent = self._candidates()
        for step in sorted(set(local) | set(persistent), reverse=True):
            tiers = ([SOURCE_LOCAL] if step in local else []) + (
                [SOURCE_PERSISTENT] if step in persistent else []
            )
            for source in tiers:
                shard, used = self._read_candidate(step, local.get(step, 0), source)
                ok, no_peer = self._all_min(1 if shard is not None else 0, 0 if used == SOURCE_PEER else 1)
                if ok == 1:
                    assert shard is not None
                    agreed = SOURCE_PEER if no_peer == 0 else source
                    return self._apply(model, optimizer, step, agreed, shard)
        self._drop_local_after(-1)
        return None

    def _candidates(self) -> tuple[dict[int, int], set[int]]:
        """({step: nonce} of memory snapshots every rank can get, in its own memory or from the pod
        holding its replica; committed steps any rank sees)."""
        mine_local: list[tuple[int, int]] = []
        held: dict[int, list[tuple[int, int]]] = {}
        if self.local_root is not None:
            mine_local = local_snapshots(self._local_dir)
            if self.replica_endpoint:
                held = held_replicas(self.local_root)
        mine_persistent = committed_steps(self.root)
        views = [(mine_local, mine_persistent, held, self.replica_endpoint)]
        if self.world_size > 1 and (self._group is not None or self._dist_ready()):
            import torch.distributed as dist

            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, views[0], group=self._group)
            views = gathered
        # Found by what a pod holds, not by which pod a rank is on now: (rank, step, nonce) -> server.
        holders: dict[tuple[int, int, int], str] = {}
        for _, _, held_by, endpoint in views:
            for r, snaps in held_by.items():
                for s, n in snaps:
                    holders.setdefault((int(r), int(s), int(n)), endpoint)
        gettable = [
            set(map(tuple, loc)) | {(s, n) for (rr, s, n) in holders if rr == r}
            for r, (loc, _, _, _) in enumerate(views)
        ]
        common = set.intersection(*gettable)
        local: dict[int, int] = {}
        for step, nonce in sorted(common):  # a step saved twice with the same nonce cannot occur
            local[step] = nonce
        self._peer_holders = {(s, n): ep for (rr, s, n), ep in holders.items() if rr == self.rank}
        persistent = set().union(*(set(p) for _, p, _, _ in views))
        return local, persistent

    def _read_candidate(
        self, step: int, nonce: int, source: str
    ) -> tuple[tuple[Manifest, tuple[Any, list[torch.Tensor]]] | None, str]:
        """(this rank's shard of the candidate or None, where it came from: a memory candidate is
        read from this rank's own snapshot, else (or when that fails) fetched from its replica)."""
        if source != SOURCE_LOCAL:
            return self._read_tier(step, nonce, source), source
        own = os.path.isdir(os.path.join(self._local_dir, local_name(step, nonce)))
        if own and (shard := self._read_tier(step, nonce, SOURCE_LOCAL)) is not None:
            return shard, SOURCE_LOCAL
        endpoint = self._peer_holders.get((step, nonce))
        if endpoint is None:
            return None, SOURCE_LOCAL
        try:
            fetch_snapshot(endpoint, self.rank, step, nonce, self._local_dir)
        except (OSError, ReplicaError, CheckpointError, ValueError, KeyError, TypeError) as e:
            log.warning("could not fetch the replica of step %d from %s: %r", step, endpoint, e)
            return None, SOURCE_PEER
        return self._read_tier(step, nonce, SOURCE_LOCAL), SOURCE_PEER

    def _read_tier(
        self, step: int, nonce: int, source: str
    ) -> tuple[Manifest, tuple[Any, list[torch.Tensor]]] | None:
        try:
            if source == SOURCE_LOCAL:
                snap_dir = os.path.join(self._local_dir, local_name(step, nonce))
                meta = read_local_meta(snap_dir)
                if (meta["step"], meta["nonce"], meta["rank"]) != (step, nonce, self.rank):
                    raise CheckpointError(f"{snap_dir}: its metadata names another snapshot")
                if meta["worldSize"] != self.world_size:
                    raise CheckpointError(f"{snap_dir}: written by {meta['worldSize']} ranks")
                manifest = Manifest(
                    step, nonce, self.world_size, meta["time"], {self.rank: meta["files"]}, meta["extra"]
                )
                return manifest, read_shard(snap_dir, self.rank, manifest)
            ckpt_dir = os.path.join(self.root, committed_name(step))
            manifest = Manifest.read(ckpt_dir)
            if manifest.world_size != self.world_size:
                # Never fall back silently: a fresh start would prune the job's real checkpoints.
                raise WorldSizeMismatch(
                    f"{ckpt_dir} was written by {manifest.world_size} ranks, this job has "
                    f"{self.world_size}; resuming on another world size is not supported"
                )
            return manifest, read_shard(ckpt_dir, self.rank, manifest)
        except WorldSizeMismatch:
            raise
        except (CheckpointError, OSError) as e:
            log.warning("skipping %s snapshot of step %d: %s", source, step, e)
            if source == SOURCE_PERSISTENT:
                self._events.put(
                    CheckpointEvent("fault", step, datetime.now(UTC), "CheckpointUnreadable", str(e))
                )
            return None

    def _apply(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        source: str,
        shard: tuple[Manifest, tuple[Any, list[torch.Tensor]]],
    ) -> Resumed:
        manifest, (skeleton, loaded) = shard
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        current = _state_of(model, optimizer)
        with torch.no_grad():
            state = _unflatten(skeleton, current, loaded, mapped=source != SOURCE_PERSISTENT)
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        self._drop_local_after(step)
        if source == SOURCE_PERSISTENT:
            # The pod's heartbeat (and NVRx's iteration file) should name the checkpoint it runs from.
            with contextlib.suppress(ValueError):
                self._events.put(CheckpointEvent("committed", step, datetime.fromisoformat(manifest.time)))
        else:
            self._events.put(CheckpointEvent("snapshot", step, datetime.now(UTC)))
            newest = latest_committed(self.root)
            if newest is not None and self.last_committed is None:  # what is persisted, for the heartbeat
                with contextlib.suppress(CheckpointError, ValueError):
                    when = datetime.fromisoformat(
                        Manifest.read(os.path.join(self.root, committed_name(newest))).time
                    )
                    self._events.put(CheckpointEvent("committed", newest, when))
        self.poll()
        return Resumed(step=step, extra=dict(state.get("extra") or manifest.extra), source=source)

    def _drop_local_after(self, step: int) -> None:
        if self.local_root is None:
            return
        for s, n in local_snapshots(self._local_dir):
            if s > step:
                with contextlib.suppress(OSError):
                    remove_local(os.path.join(self._local_dir, local_name(s, n)))

    def _all_min(self, *values: int) -> tuple[int, ...]:
        if self.world_size > 1 and (self._group is not None or self._dist_ready()):
            import torch.distributed as dist

            t = torch.tensor(list(values), dtype=torch.int64)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self._group)
            return tuple(int(x) for x in t.tolist())
        return values

    # --- internals ------------------------------------------------------------------------------
    def _dist_ready(self) -> bool:
        import torch.distributed as dist

        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _agree(
        self,
        *,
        busy: bool,
        persisting: bool,
        replicating: bool = False,
        write_s: float = 0.0,
        step_s: float = 0.0,
    ) -> tuple[bool, bool, bool, int, float, float]:
        """(any rank busy, any rank persisting, any rank replicating, rank 0's nonce, the slowest
        memory-tier write, the fastest step time; 0 = unknown on some rank): one tiny MAX all-reduce."""
        nonce = random.getrandbits(31) | 1 if self.rank == 0 else 0
        write_us, step_us = int(write_s * 1e6), int(step_s * 1e6)
        if self.world_size > 1 and (self._group is not None or self._dist_ready()):
            import torch.distributed as dist

            # MAX of -step: the fastest step; a rank that has none yet (0) makes it unknown (0).
            t = torch.tensor(
                [int(busy), int(persisting), int(replicating), nonce, write_us, -step_us], dtype=torch.int64
            )
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self._group)
            return bool(t[0]), bool(t[1]), bool(t[2]), int(t[3]), int(t[4]) / 1e6, -int(t[5]) / 1e6
        return busy, persisting, replicating, nonce or 1, write_us / 1e6, step_us / 1e6

    def _host_buffer(self, i: int, src: torch.Tensor, pin: bool | None = None) -> torch.Tensor:
        if i < len(self._host):
            buf = self._host[i]
            if buf.shape == src.shape and buf.dtype == src.dtype:
                return buf
        pin = src.is_cuda if pin is None else pin
        buf = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pin)
        if i < len(self._host):
            self._host[i] = buf
        else:
            self._host.append(buf)
        return buf

    def _copy_to_host(
        self, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer | None
    ) -> tuple[list[torch.Tensor], Any]:
        host = [self._host_buffer(i, t) for i, t in enumerate(tensors)]
        del self._host[len(tensors) :]
        if not any(t.is_cuda for t in tensors):
            for buf, t in zip(host, tensors, strict=True):
                buf.copy_(t)
            return host, None
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for buf, t in zip(host, tensors, strict=True):
                buf.copy_(t, non_blocking=t.is_cuda)
                if t.is_cuda:
                    t.record_stream(stream)
            ready = torch.cuda.Event(enable_timing=True)
            ready.record(stream)
        self._fence_event = ready
        self._copy_events = (start, ready)
        if optimizer is not None and optimizer not in self._hooked:
            optimizer.register_step_pre_hook(lambda *_: self.fence())
            self._hooked.add(optimizer)
        return host, ready

    def _emit(self, ev: CheckpointEvent) -> None:
        self._events.put(ev)
        self.poll()

    def _dispatch(self, ev: CheckpointEvent) -> None:
        if ev.kind == "committed":
            self.last_committed = ev.step
        elif ev.kind == "snapshot":
            self.last_local = ev.step
        elif ev.kind == "replicated":
            self.last_replicated = ev.step
        if self._on_event is not None:
            self._on_event(ev)
        r = self._reporter
        if r is None:
            return
        if ev.kind == "committed":
            r.checkpoint_committed(ev.step, ev.time)
        elif ev.kind == "skipped":
            r.checkpoint_skipped()
        elif ev.kind == "snapshot":
            r.memory_snapshot(ev.step)
        elif ev.kind == "persisted" and ev.seconds is not None:
            r.persisted(ev.seconds)
        elif ev.kind == "replicated":
            r.replicated(ev.step)
        elif ev.kind == "fault":
            r.fault(FaultSeverity.SOFT, ev.reason, ev.message)

    # --- the writer thread ------------------------------------------------------------------------
    def _write(self, snap: _Snapshot) -> None:
        """Persist straight from the host buffers (no memory tier)."""

        def produce(partial: str) -> dict[str, dict[str, int]]:
            if snap.ready is not None:
                snap.ready.synchronize()
            return self._write_shard(partial, snap)

        self._persist(snap.step, snap.nonce, snap.extra, produce)

    def _persist(
        self,
        step: int,
        nonce: int,
        extra: dict[str, Any],
        produce: Callable[[str], dict[str, dict[str, int]]],
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
            seconds = time.monotonic() - t0
            self._events.put(CheckpointEvent("persisted", step, datetime.now(UTC), seconds=seconds))
            if self.rank == 0:
                self._commit(step, nonce, extra, partial)
            else:
                self._awaiting_commit = step
        except _Aborted:
            self._drop(partial, mine)
        except _Abandoned as e:
            self._drop(partial, mine)
            self._events.put(
                CheckpointEvent(
                    "fault", step, datetime.now(UTC), FaultReason.CHECKPOINT_COMMIT_ABANDONED, str(e)
                )
            )
        except OSError as e:
            reason = (
                FaultReason.CHECKPOINT_STORAGE_FULL
                if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else FaultReason.CHECKPOINT_WRITE_FAILED
            )
            write_failed_marker(partial, self.rank, f"{reason}: {e}")
            self._drop(partial, mine)
            msg = f"checkpoint of step {step} not written: {e}"
            self._events.put(CheckpointEvent("fault", step, datetime.now(UTC), reason, msg))
        except Exception as e:
            write_failed_marker(partial, self.rank, f"{FaultReason.CHECKPOINT_WRITE_FAILED}: {e!r}")
            self._drop(partial, mine)
            msg = f"checkpoint of step {step} failed: {e!r}"
            self._events.put(
                CheckpointEvent("fault", step, datetime.now(UTC), FaultReason.CHECKPOINT_WRITE_FAILED, msg)
            )

    # --- the memory tier ----------------------------------------------------------------------------
    def _write_local(self, snap: _Snapshot, persist: bool) -> None:
        """The writer with a memory tier: host buffers -> this rank's local snapshot (commit =
        one rename), then hand persistence to the persister thread, reading the local copy."""
        name = local_name(snap.step, snap.nonce)
        partial = os.path.join(self._local_dir, f"{name}.partial")
        final = os.path.join(self._local_dir, name)
        try:
            self._recycle_local(partial)
            if snap.ready is not None:
                snap.ready.synchronize()
            t0 = time.monotonic()
            files = self._write_shard(
                partial, snap, throttle=False, checksum=False, threads=self.local_write_threads
            )
            seconds = time.monotonic() - t0
            self._last_write_s = seconds  # read by the training thread at the next save (a float)
            meta = {
                "step": snap.step,
                "nonce": snap.nonce,
                "worldSize": self.world_size,
                "rank": self.rank,
                "time": datetime.now(UTC).isoformat(),
                "files": files,
                "extra": snap.extra,
            }
            write_local_meta(partial, meta)
            os.rename(partial, final)
        except Exception as e:  # ENOSPC on the memory volume, most likely: persist all the same
            shutil.rmtree(partial, ignore_errors=True)
            msg = f"memory snapshot of step {snap.step} not written: {e!r}"
            self._events.put(
                CheckpointEvent(
                    "fault", snap.step, datetime.now(UTC), FaultReason.MEMORY_SNAPSHOT_FAILED, msg
                )
            )
            if persist:
                self._write(snap)
            return
        self._events.put(CheckpointEvent("snapshot", snap.step, datetime.now(UTC), seconds=seconds))
        if self._replicator is not None and snap.replicate:
            self._replicator.offer(snap.step, snap.nonce, final)
        if persist:
            self._persist_source = final
            self._persister = threading.Thread(
                target=self._persist_local,
                args=(snap.step, snap.nonce, snap.extra, final),
                name=f"rtj-ckpt-persister-{snap.step}",
                daemon=True,
            )
            self._persister.start()
        self._prune_local(protect=final)

    def _recycle_local(self, partial: str) -> None:
        """Make `partial`, reusing the oldest snapshot that is pruned after this one commits: its
        rename uncommits it, and overwriting its file in place skips the page allocation of a new
        tmpfs file (3-4x the write time measured here). Else a new directory."""
        with self._local_lock:
            protected = {os.path.basename(p) for p in self._protected() if p}
            old = [local_name(s, n) for s, n in local_snapshots(self._local_dir)[self.local_keep - 1 :]]
            old = [n for n in old if n not in protected]
            if not old:
                os.makedirs(partial, exist_ok=True)
                return
            os.rename(os.path.join(self._local_dir, old[-1]), partial)
        os.unlink(os.path.join(partial, LOCAL_META))
        bin_path = os.path.join(partial, shard_bin(self.rank))
        with contextlib.suppress(FileNotFoundError):
            os.replace(bin_path, f"{bin_path}.tmp")  # _write_shard overwrites a .tmp in place

    def _persist_local(self, step: int, nonce: int, extra: dict[str, Any], src: str) -> None:
        try:
            self._persist(step, nonce, extra, lambda partial: self._copy_shard(src, partial))
        finally:
            self._persist_source = None

    def _copy_shard(self, src: str, partial: str) -> dict[str, dict[str, int]]:
        """Copy this rank's local shard into a partial under root, checking its CRC32 on the way."""
        files = read_local_meta(src)["files"]
        bin_name, idx_name = shard_bin(self.rank), shard_idx(self.rank)
        bin_path = os.path.join(partial, bin_name)
        tmp = f"{bin_path}.tmp"
        crc, offset, t_start = 0, 0, time.monotonic()
        with open(os.path.join(src, bin_name), "rb", buffering=0) as fin, open(tmp, "wb", buffering=0) as f:
            while chunk := fin.read(CHUNK_BYTES):
                if self._abort.is_set():
                    raise _Aborted
                view = memoryview(chunk)
                written = 0
                while written < len(view):
                    written += f.write(view[written:])
                crc = crc32_of(view, crc)
                offset += len(view)
                self._throttle(offset, t_start)
            os.fsync(f.fileno())
        with open(os.path.join(src, idx_name), "rb") as fin:
            idx = fin.read()
        if offset != files[bin_name]["size"] or len(idx) != files[idx_name]["size"]:
            raise CheckpointError(f"{src}: its files do not have the sizes it was committed with")
        os.replace(tmp, bin_path)
        write_file_atomic(os.path.join(partial, idx_name), idx)
        # The memory tier has no checksums (committed by rename, in RAM); the persisted copy does.
        return {
            bin_name: {"size": offset, "crc32": crc},
            idx_name: {"size": len(idx), "crc32": crc32_of(idx)},
        }

    def _protected(self) -> tuple[str | None, ...]:
        """Snapshots kept whatever their age: being persisted, being replicated, replicated last."""
        return self._persist_source, self._replica_source, self._replicated_source

    def _prune_local(self, protect: str | None, *, committed: bool = True) -> None:
        """Keep the newest `local_keep` local snapshots (and the protected ones); drop the rest
        (with committed=False: keep every committed one) and any partial or half-deleted
        leftovers (only this rank's writer writes here)."""
        with self._local_lock:
            snaps = local_snapshots(self._local_dir)
            keep = {local_name(s, n) for s, n in (snaps[: self.local_keep] if committed else snaps)}
            keep |= {os.path.basename(p) for p in (protect, *self._protected()) if p}
            try:
                names = os.listdir(self._local_dir)
            except FileNotFoundError:
                return
            for n in names:
                if n not in keep:
                    with contextlib.suppress(OSError):
                        remove_local(os.path.join(self._local_dir, n))

    # --- the peer replica ---------------------------------------------------------------------------
    def _protect_replica(self, path: str | None) -> bool:
        """The replicator's hold on the snapshot it streams: not pruned nor recycled meanwhile."""
        with self._local_lock:
            if path is not None and not os.path.isfile(os.path.join(path, LOCAL_META)):
                return False  # pruned or recycled before its turn
            self._replica_source = path
            return True

    def _replicated(self, offer: Offer, seconds: float, error: BaseException | None) -> None:
        if error is None:
            with self._local_lock:
                self._replicated_source = offer.path
            self._events.put(CheckpointEvent("replicated", offer.step, datetime.now(UTC), seconds=seconds))
            return
        self.replicate_failures += 1
        if self.replicate_failures in (1, 10) or self.replicate_failures % 100 == 0:
            log.warning(
                "replica of step %d not sent (%d failures): %r", offer.step, self.replicate_failures, error
            )

    def wait_replicated(self, timeout: float | None = None) -> bool:
        """Wait until no replica is pending or streaming (tests, the end of training)."""
        ok = self._replicator is None or self._replicator.wait(timeout)
        self.poll()
        return ok

    def _drop(self, partial: str, mine: list[str]) -> None:
        for p in mine:
            for q in (p, f"{p}.tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(q)
        if self.rank == 0:
            remove_tree(partial)

    def _write_shard(
        self, partial: str, snap: _Snapshot, throttle: bool = True, checksum: bool = True, threads: int = 1
    ) -> dict[str, dict[str, int | None]]:
        """This rank's .bin and .idx in `partial`; their sizes and CRC32s (None: `checksum` off,
        the memory tier: a CRC32 of 6.85 GB takes seconds, a memory copy a fraction of that).
        `threads` > 1 (the memory tier: no checksum, no throttle) splits the copy over threads."""
        entries: list[TensorEntry] = []
        bin_path = os.path.join(partial, shard_bin(self.rank))
        tmp = f"{bin_path}.tmp"
        crc, offset = 0, 0
        t_start = time.monotonic()
        with open(tmp, "r+b" if os.path.exists(tmp) else "wb", buffering=0) as f:
            if threads > 1 and not checksum and not throttle:
                offset = self._write_parallel(f.fileno(), snap.host, entries, threads)
            else:
                for t in snap.host:
                    view = _as_bytes(t)
                    entries.append(
                        TensorEntry(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, len(view))
                    )
                    for start in range(0, len(view), CHUNK_BYTES):
                        if self._abort.is_set():
                            raise _Aborted
                        chunk = view[start : start + CHUNK_BYTES]
                        written = 0
                        while written < len(chunk):
                            written += f.write(chunk[written:])
                        if checksum:
                            crc = crc32_of(chunk, crc)
                        offset += len(chunk)
                        if throttle:
                            self._throttle(offset, t_start)
            f.truncate(offset)  # a recycled file may have been longer
            os.fsync(f.fileno())
        os.replace(tmp, bin_path)
        idx = ShardIndex({"state": snap.skeleton, "extra": snap.extra}, entries).to_bytes()
        write_file_atomic(os.path.join(partial, shard_idx(self.rank)), idx)
        return {
            shard_bin(self.rank): {"size": offset, "crc32": crc if checksum else None},
            shard_idx(self.rank): {"size": len(idx), "crc32": crc32_of(idx) if checksum else None},
        }

    def _write_parallel(
        self, fd: int, host: list[torch.Tensor], entries: list[TensorEntry], threads: int
    ) -> int:
        """Write `host` into `fd` as the one-writer loop lays it out (appending to `entries`), in
        CHUNK_BYTES pieces spread over `threads` threads: one thread copies a few GB/s into tmpfs,
        well below what the memory bus gives several. The syscalls release the GIL."""
        pieces: list[tuple[memoryview, int]] = []
        offset = 0
        for t in host:
            view = _as_bytes(t)
            entries.append(
                TensorEntry(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, len(view))
            )
            pieces.extend((view[i : i + CHUNK_BYTES], offset + i) for i in range(0, len(view), CHUNK_BYTES))
            offset += len(view)
        os.ftruncate(fd, offset)  # the final size at once (a recycled file may have been longer)

        def write(piece: tuple[memoryview, int]) -> None:
            chunk, at = piece
            if self._abort.is_set():
                raise _Aborted
            done = 0
            while done < len(chunk):
                done += os.pwrite(fd, chunk[done:], at + done)

        with ThreadPoolExecutor(max_workers=min(threads, max(1, len(pieces)))) as pool:
            for _ in pool.map(write, pieces):  # re-raises the first failure (or _Aborted)
                pass
        return offset

    def _throttle(self, written: int, t_start: float) -> None:
        if not self.write_bytes_per_s:
            return
        ahead = written / self.write_bytes_per_s - (time.monotonic() - t_start)
        if ahead > 0 and self._abort.wait(ahead):
            raise _Aborted

    def _commit(self, step: int, nonce: int, extra: dict[str, Any], partial: str) -> None:
        deadline = time.monotonic() + self.commit_timeout_s
        while True:
            ranks = {r: read_done_marker(partial, r) for r in range(self.world_size)}
            if all(v is not None for v in ranks.values()):
                break
            if any_failed(partial, self.world_size):
                raise _Abandoned(f"a rank failed to write its shard of step {step}")
            if time.monotonic() > deadline:
                raise _Abandoned(f"not all ranks wrote step {step} within {self.commit_timeout_s} s")
            if self._abort.wait(0.01):
                raise _Aborted
        now = datetime.now(UTC)
        manifest = Manifest(step, nonce, self.world_size, now.isoformat(), ranks, extra)  # type: ignore[arg-type]
        write_file_atomic(os.path.join(partial, MANIFEST), manifest.to_bytes())
        final = os.path.join(self.root, committed_name(step))
        if os.path.isdir(final):
            # The same step was committed before a restart; never replace committed data.
            remove_tree(partial)
        else:
            os.rename(partial, final)
            fsync_dir(self.root)
        self._events.put(CheckpointEvent("committed", step, now))
        for old in committed_steps(self.root)[self.keep :]:
            with contextlib.suppress(OSError):
                remove_tree(os.path.join(self.root, committed_name(old)))
        self._cleanup_stale(keep_partial=None)

    def _cleanup_stale(self, keep_partial: str | None) -> None:
        for path in stale_entries(self.root, keep_partial):
            with contextlib.suppress(OSError):
                remove_tree(path)


def read_shard(ckpt_dir: str, rank: int, manifest: Manifest) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors) of one rank's shard, checked against the manifest's sizes and CRC32
    (sizes only for a memory-tier snapshot, whose entries carry no CRC32)."""
    files = manifest.ranks.get(rank)
    if files is None:
        raise CheckpointError(f"{ckpt_dir}: no shard for rank {rank}")
    idx_meta, bin_meta = files[shard_idx(rank)], files[shard_bin(rank)]
    with open(os.path.join(ckpt_dir, shard_idx(rank)), "rb") as f:
        idx_bytes = f.read()
    checked = idx_meta["crc32"] is not None  # None: the memory tier (sizes only)
    if len(idx_bytes) != idx_meta["size"] or (checked and crc32_of(idx_bytes) != idx_meta["crc32"]):
        raise CheckpointError(f"{ckpt_dir}: {shard_idx(rank)} fails its checksum")
    index = ShardIndex.from_bytes(idx_bytes)
    if not checked:
        tensors = _map_shard(os.path.join(ckpt_dir, shard_bin(rank)), index, bin_meta["size"])
        return _shard_state(index), tensors
    tensors: list[torch.Tensor] = []
    crc = 0
    with open(os.path.join(ckpt_dir, shard_bin(rank)), "rb", buffering=0) as f:
        if os.fstat(f.fileno()).st_size != bin_meta["size"]:
            raise CheckpointError(f"{ckpt_dir}: {shard_bin(rank)} does not have the size it was written with")
        for e in index.entries:
            raw = torch.empty(e.nbytes, dtype=torch.uint8)
            if e.nbytes:
                view = memoryview(raw.numpy()).cast("B")
                got = 0
                while got < e.nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise CheckpointError(f"{ckpt_dir}: {shard_bin(rank)} is truncated")
                    got += n
                if checked:
                    crc = crc32_of(view, crc)
            tensors.append(raw.view(_dtype(e.dtype)).reshape(e.shape))
    if checked and crc != bin_meta["crc32"]:
        raise CheckpointError(f"{ckpt_dir}: {shard_bin(rank)} fails its checksum")
    return _shard_state(index), tensors


def _shard_state(index: ShardIndex) -> dict[str, Any]:
    skeleton = index.skeleton
    return {
        "model": skeleton["state"]["model"],
        "optim": skeleton["state"]["optim"],
        "extra": skeleton["extra"],
    }


def _map_shard(path: str, index: ShardIndex, size: int) -> list[torch.Tensor]:
    """A memory-tier shard's tensors as views of the file mapped into memory: its pages are already
    in the tmpfs, so nothing is allocated or copied before the state is loaded from them (reading
    them into new tensors took 14 s of a restart for 13.7 GB on an H200, issue 14). Copy-on-write
    (MAP_PRIVATE): the snapshot is never changed through them."""
    if os.path.getsize(path) != size:
        raise CheckpointError(f"{path} does not have the size it was written with")
    whole = (
        torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
        if size
        else torch.empty(0, dtype=torch.uint8)
    )
    tensors = []
    for e in index.entries:
        if e.offset < 0 or e.offset + e.nbytes > size:
            raise CheckpointError(f"{path}: an entry lies outside the file")
        raw = whole[e.offset : e.offset + e.nbytes]
        dtype = _dtype(e.dtype)
        if e.offset % dtype.itemsize:  # a view must be aligned to its element size
            raw = raw.clone()
        tensors.append(raw.view(dtype).reshape(e.shape))
    return tensors


def latest_committed(root: str, *, world_size: int | None = None) -> int | None:
    """Newest committed step under root whose manifest validates, or None (partials never count)."""
    from .checkpoint_format import latest_valid

    return latest_valid(root, world_size=world_size)
