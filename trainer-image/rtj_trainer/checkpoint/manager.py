"""`CheckpointManager`: the one object a training loop holds, over the parts of this package
(`parts.Parts`): it asks them, in the training thread, what to do at each step."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from .config import DEFAULT_LOCAL_WRITE_THREADS, CheckpointConfig
from .events import CheckpointEvent, Reporter, now
from .parts import build_parts
from .resume import Resumed
from .staging import Snapshot
from .state_tree import flatten, state_of

log = logging.getLogger("rtj_trainer")


@dataclasses.dataclass(frozen=True)
class EmergencySave:
    """Which tiers hold the step of an emergency save when `emergency_save` returned."""

    step: int
    #: Committed in this rank's memory tier: an in-job or in-place restart resumes from it; it goes
    #: with the pod's memory.
    memory: bool
    #: The peer committed its replica of that memory snapshot: it outlives this pod.
    replica: bool
    #: Committed on the checkpoint volume (every rank's shard): it outlives the job's pods.
    persisted: bool
    #: With `handoff`: the committed memory snapshot (its directory) left for the pod's entrypoint
    #: to persist after the rank exits (`checkpoint.handoff`); None: nothing handed off.
    handed_off: str | None = None

    def __bool__(self) -> bool:
        """Persisted: what `emergency_save` returned before it said more."""
        return self.persisted


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

    The keyword arguments are `CheckpointConfig`'s settings under the names this class has always
    taken (root = checkpoint_dir, interval_steps, keep, local_root = memory_tier_root, local_*), and
    newer ones under their own name (memory_snapshot_gpu_staging);
    `CheckpointManager.from_config(CheckpointConfig.from_rank_env())` reads them from the rank's
    environment instead.
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
        memory_snapshot_gpu_staging: bool = True,
    ) -> None:
        config = CheckpointConfig.of_arguments(
            root, rank, world_size, interval_steps, keep, commit_timeout_s, write_bytes_per_s,
            local_root, local_interval_steps, local_keep, local_write_threads, adapt_local_interval,
            peer_endpoint, replica_endpoint, memory_snapshot_gpu_staging,
        )  # fmt: skip
        self._build(config, group, reporter, on_event)

    @classmethod
    def from_config(
        cls,
        config: CheckpointConfig,
        *,
        group: Any = None,
        reporter: Reporter | None = None,
        on_event: Callable[[CheckpointEvent], None] | None = None,
    ) -> CheckpointManager:
        self = cls.__new__(cls)
        self._build(config, group, reporter, on_event)
        return self

    def _build(
        self,
        cfg: CheckpointConfig,
        group: Any,
        reporter: Reporter | None,
        on_event: Callable[[CheckpointEvent], None] | None,
    ) -> None:
        self.config = cfg
        self._p = build_parts(cfg, group, reporter, on_event)
        #: Whether the last `save` that went ahead also persists (else: memory tier only).
        self.last_save_persists = False
        self.saves_started = 0
        self.saves_skipped = 0
        self.last_snapshot_s = 0.0
        self._prefetched: tuple[int, int] | None = None  # (step, nonce) of `prefetch_memory_snapshot`

    # --- the training-loop API ----------------------------------------------------------------
    def set_group(self, group: Any) -> None:
        """The CPU (gloo) process group used to agree on saves; renew after an in-process restart."""
        self._p.agreement.group = group

    @property
    def busy(self) -> bool:
        """The host buffers are still being written out (a new snapshot must wait)."""
        return self._p.writer.busy or self._p.staging.preparing

    @property
    def preparing(self) -> bool:
        """A save now would wait for `prepare` (in the background): its GPU buffer, or the memory
        tier's slot it would take, is not ready yet."""
        return self._p.staging.preparing

    @property
    def persisting(self) -> bool:
        """A persist to `root` is in flight."""
        return self.busy if self._p.memory is None else self._p.persistent.persisting

    def local_snapshot_steps(self) -> list[int]:
        """Steps of this rank's committed memory snapshots, newest first, read from the memory tier
        now (the writer thread's latest commit included, unlike `last_local`)."""
        return [step for step, _nonce in self._p.memory.snapshots()] if self._p.memory is not None else []

    def is_due(self, step: int) -> bool:
        return self._p.schedule.is_due(step)

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
        self._p.schedule.tick(time.monotonic())
        if not self.is_due(step):
            return ""
        self._p.schedule.saving()
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
        handoff: bool = False,
    ) -> bool:
        """Snapshot now (all ranks, same step); persist too when due. False: skipped (busy).
        `handoff` (a memory tier's emergency save): a due persist is left to the pod's entrypoint
        and written by this rank only if the memory snapshot fails."""
        schedule = self._p.schedule
        persist_due, memory_due = schedule.persist_due(step, force_persist), schedule.memory_due(step)
        agreed = self._p.agreement.agree_on_save(
            busy=self.busy,
            persisting=self.persisting,
            replicating=self._p.replication is not None and self._p.replication.busy,
            write_s=self._p.memory.last_write_s if self._p.memory is not None else 0.0,
            step_s=schedule.step_s,
        )
        if self._p.replication is not None and not agreed.any_busy and not agreed.any_replicating:
            self._p.replication.settle()
        decision = schedule.decide(step, persist_due, memory_due, agreed, force=force_persist)
        if decision.skipped:
            self.saves_skipped += 1
            self._p.events.put(CheckpointEvent("skipped", step, now(), "PreviousSaveDraining"))
            self.poll()
        if not decision.go:
            return False
        self.last_save_persists = decision.persist and not handoff
        t0 = time.perf_counter()
        tensors: list[torch.Tensor] = []
        skeleton = flatten(state_of(model, optimizer), tensors)
        ring = self._p.ring
        if ring is not None:
            ring.claim(step, agreed.nonce)  # the copy lands in the memory tier's slot itself
        host, ready, drain = self._p.staging.copy_to_host(tensors, optimizer)
        self.last_snapshot_s = time.perf_counter() - t0
        # Replicated only when no rank's replicator is busy: every rank offers the same steps, so a
        # lost pod's replicas are of a step the survivors hold too (coalescing per rank would not).
        replicate = self._p.replication is not None and not agreed.any_replicating
        snap = Snapshot(step, agreed.nonce, skeleton, host, ready, dict(extra or {}), replicate)
        snap.drain = drain
        if ring is not None and ring.partial is not None:
            snap.partial, snap.entries, snap.slot = ring.partial, ring.entries, ring.slot
        self._p.control.abort.clear()
        self._p.writer.start(snap, self.last_save_persists, fallback_persist=decision.persist and handoff)
        self.saves_started += 1
        return True

    def emergency_save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        extra: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        handoff: Callable[[str], bool] | None = None,
    ) -> EmergencySave:
        """Save `step` now, on every rank (a graceful stop), and return by `deadline` (wall clock,
        `time.time()`: `GracefulStop.deadline`) or after `timeout` seconds, whichever comes first
        (neither given: `commit_timeout_s`), saying which tiers hold the step by then.

        The saves in flight of older steps are abandoned (a persist, a replica stream: the newest
        state replaces them). Then the memory snapshot of `step` is committed first (memory speed),
        and its peer replica (when configured) and its persist run concurrently, each waited for
        only until the deadline. A persist still running then is left as its partial when the rank
        exits: never loaded, removed by rank 0 at the next start.

        `handoff` (with a memory tier): called with the directory of the step's memory snapshot as
        soon as it is committed, to leave it to the pod's entrypoint, which persists it after the
        rank exits (`checkpoint.handoff`); when it returns True the rank does not persist the step
        (`handed_off`). Should the memory snapshot fail, or `handoff` return False, the rank
        persists the step as above.
        """
        limits = [self.commit_timeout_s] if timeout is None and deadline is None else []
        limits += [timeout] if timeout is not None else []
        limits += [deadline - time.time()] if deadline is not None else []
        end = time.monotonic() + max(0.0, min(limits))

        def left() -> float:
            return max(0.0, end - time.monotonic())

        self.wait_local(left())
        self.abort_inflight(timeout=left())
        if self._p.replication is not None:
            self._p.replication.cancel(left())
        self._p.schedule.pending_memory = self._p.schedule.pending = False
        handoff = handoff if self._p.memory is not None else None
        if not self.save(step, model, optimizer, extra, force_persist=True, handoff=handoff is not None):
            return EmergencySave(step, memory=False, replica=False, persisted=False)
        self.wait_local(left())  # the memory snapshot (or, without a memory tier, the whole persist)
        if handoff is not None and (snapshot := self._committed_snapshot(step)) is not None:
            if handoff(snapshot[0]):
                if self._p.replication is not None:
                    self.wait_replicated(left())
                return EmergencySave(
                    step,
                    memory=True,
                    replica=self._p.replication is not None and self.last_replicated == step,
                    persisted=False,
                    handed_off=snapshot[0],
                )
            # Not left to the pod after all: persisted here, from the committed snapshot.
            self._p.persistent.persist_in_background(step, snapshot[1], dict(extra or {}), snapshot[0])
        self.wait(left())  # the persist and the commit of every rank's shard
        if self._p.replication is not None:
            self.wait_replicated(left())
        return EmergencySave(
            step,
            memory=self._p.memory is not None and self.last_local == step,
            replica=self._p.replication is not None and self.last_replicated == step,
            persisted=self.last_committed == step,
        )

    def _committed_snapshot(self, step: int) -> tuple[str, int] | None:
        """(the directory, the nonce) of this rank's committed memory snapshot of `step`, if any."""
        memory = self._p.memory
        if memory is None or self.last_local != step:
            return None
        nonces = [nonce for s, nonce in memory.snapshots() if s == step]
        return (memory.path(step, nonces[0]), nonces[0]) if nonces else None

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """Allocate the pinned host buffers now, not inside the first save, and in the background:
        pinning 13.7 GB took 6-7 s of the first step after a restart on an H200. Until they are
        ready the manager is `busy`, so a save that falls due meanwhile waits for the next step,
        as it waits for a writer still running.

        Call after the first optimizer step: the GPU staging buffer is sized against what training
        reserved by then (an optimizer with no state yet is never given one here).
        """
        self._p.staging.prepare(model, optimizer)

    def stop_gpu_staging(self) -> bool:
        """Give the GPU staging buffer of memory snapshots (`device_stage`) back for good: training
        ran out of GPU memory, and the buffer is memory it needs. Snapshots take the pinned path from
        the next `prepare` on and a load no longer goes through a GPU buffer: in this process and,
        when a buffer was held, in this rank's next processes in the pod
        (`MemoryTier.refuse_gpu_staging`). True if a buffer was held (a drain in flight keeps its
        reference until it is done)."""
        stage = self._p.staging.device
        if stage is None:
            return False
        had = stage.size() > 0
        self._p.staging.device = None
        if self._p.memory is not None:
            self._p.memory.device = None
            if had:
                self._p.memory.refuse_gpu_staging()
        stage.flat = None
        stage.ops.release()
        if had:
            log.warning("memory snapshots leave GPU staging for pinned buffers: training ran out of memory")
        return had

    def fence(self) -> None:
        """Make the current CUDA stream wait for the last snapshot copy (before mutating state).

        Registered as an optimizer step pre-hook by `save`; call it yourself before any other
        in-place change of parameters or optimizer state.
        """
        self._p.staging.fence()

    def copy_seconds(self) -> float | None:
        """GPU time of the last snapshot's device-to-host copy, once it has finished (else None)."""
        return self._p.staging.copy_seconds()

    def poll(self) -> list[CheckpointEvent]:
        """Report what the writer did (commits, faults) from the training thread; cheap."""
        self._p.persistent.poll_commit()
        return self._p.events.drain()

    def wait_local(self, timeout: float | None = None) -> bool:
        """Wait for the writer only (the host buffers are free, a memory snapshot committed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in (self._p.staging.preparer, self._p.writer.thread):
            if t is not None:
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.poll()
        return not self.busy

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight save (end of training, tests); True when none is left."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.commit_timeout_s)
        threads: tuple[Callable[[], Any], ...] = (
            lambda: self._p.staging.preparer,
            lambda: self._p.writer.thread,
            lambda: self._p.persistent.persister,  # read after the writer ended: it may start one
            lambda: self._p.persistent.cleaner,
        )
        for thread in threads:
            if (t := thread()) is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        self._p.persistent.wait_commit(deadline)
        self.poll()
        return not self.busy and not self.persisting

    def abort_inflight(self, timeout: float = 5.0) -> None:
        """Stop the in-flight save (its partial is dropped); used when the job is torn down."""
        self._p.control.abort.set()
        for t in (self._p.writer.thread, self._p.persistent.persister):
            if t is not None:
                t.join(timeout)
        self._p.control.abort.clear()
        self.poll()

    def close(self, timeout: float | None = None) -> None:
        """Wait for the writes, then let go of the GPU staging's chunks and its connection to the
        pod's slot copier (a later save takes them again)."""
        self.wait(timeout)
        memory = self._p.memory
        if memory is not None and memory.device is not None:
            memory.device.close()

    def wait_replicated(self, timeout: float | None = None) -> bool:
        """Wait until no replica is pending or streaming (tests, the end of training)."""
        ok = self._p.replication is None or self._p.replication.wait(timeout)
        self.poll()
        return ok

    # --- resume --------------------------------------------------------------------------------
    def prefetch_memory_snapshot(self, device: int) -> tuple[int, int] | None:
        """In a new rank process, before its process group is up: begin copying this rank's newest
        memory snapshot to GPU `device` in the background, so that `load_latest`, if the ranks agree
        on it, finds it there (`memory_tier.MemoryTier.prefetch_newest`); its (step, nonce) or None."""
        memory = self._p.memory
        self._prefetched = memory.prefetch_newest(device) if memory is not None else None
        return self._prefetched

    def prefetch_report(self) -> dict[str, Any] | None:
        """The prefetch, once the resume took or discarded it: its step, whether the resume loaded
        from it, and the seconds its copy took; None before, or when there was none."""
        memory = self._p.memory
        last = memory.device.last_prefetch if memory is not None and memory.device is not None else None
        if self._prefetched is None or last is None:
            return None
        used, seconds = last
        took = None if seconds is None else round(seconds, 3)
        return {"step": self._prefetched[0], "used": used, "seconds": took}

    def load_latest(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
    ) -> Resumed | None:
        """Load the newest step that every rank can read intact, local or persistent; None if none
        (`resume` says how the ranks choose it)."""
        resumed = self._p.resume.load_latest(model, optimizer)
        if resumed is not None:
            self.poll()
        return resumed

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @world_size.setter
    def world_size(self, value: int) -> None:
        """As if the job were resized (tests): every part sees the new world size."""
        self.config = dataclasses.replace(self.config, world_size=value)
        self._p.set_world_size(value)

    # --- settings and figures, read by training scripts, benchmarks and tests ------------------------
    root = property(lambda self: self.config.checkpoint_dir)
    rank = property(lambda self: self.config.rank)
    interval_steps = property(lambda self: self.config.checkpoint_interval_steps)
    keep = property(lambda self: self.config.checkpoints_to_keep)
    commit_timeout_s = property(lambda self: self.config.commit_timeout_s)
    write_bytes_per_s = property(lambda self: self.config.write_bytes_per_s)
    local_root = property(lambda self: self.config.memory_tier_root)
    local_interval_steps = property(lambda self: self.config.memory_snapshot_interval_steps)
    local_keep = property(lambda self: self.config.memory_snapshots_to_keep)
    local_write_threads = property(lambda self: self.config.memory_snapshot_write_threads)
    adapt_local_interval = property(lambda self: self.config.adapt_memory_snapshot_interval)
    replica_endpoint = property(lambda self: self.config.replica_endpoint)
    #: The memory tier's interval in effect: local_interval_steps, or with adapt_local_interval the
    #: one the measured write fits in (schedule.snapshot_every), agreed by the ranks at each save.
    local_every = property(lambda self: self._p.schedule.memory_every)
    last_committed = property(lambda self: self._p.events.last_committed)
    last_local = property(lambda self: self._p.events.last_local)
    last_replicated = property(lambda self: self._p.events.last_replicated)
    #: Memory snapshots are staged on the GPU now (`device_stage`: it kept a buffer and has not
    #: fallen back); False: the pinned path, or a state on the CPU.
    staged_on_device = property(
        lambda self: self._p.staging.device is not None and self._p.staging.device.size() > 0
    )

    @property
    def last_drain(self) -> tuple[float, float] | None:
        """The last snapshot drained from the GPU: (seconds waiting for its chunks to leave the GPU,
        seconds copying them into the memory tier); None when none was staged there."""
        device = self._p.staging.device
        return device.pipe.last_drain if device is not None and device.pipe is not None else None

    @property
    def drained_by_copier(self) -> bool:
        """Whether the pod's slot copier copies the drained snapshots into the memory tier (else
        the rank does: no copier in the pod, or it failed)."""
        device = self._p.staging.device
        return device is not None and device.pipe is not None and device.pipe.copier is not None

    replicate_failures = property(
        lambda self: self._p.replication.replicate_failures if self._p.replication is not None else 0
    )
    # The parts' state under the names tests and benchmarks look at.
    _writer = property(lambda self: self._p.writer.thread)
    _preparer = property(lambda self: self._p.staging.preparer)
    _persister = property(lambda self: self._p.persistent.persister)
    _step_s = property(lambda self: self._p.schedule.step_s)
    _last_write_s = property(lambda self: self._p.memory.last_write_s if self._p.memory is not None else 0.0)
    _host = property(lambda self: getattr(self._p.staging.buffers, "tensors", []))
