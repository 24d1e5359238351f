"""Resume: the newest step every rank can load intact, from memory, a peer's memory or root.

The candidates are the same on every rank: memory snapshots that every rank can get with the same
nonce (one save, never a mix of two), from its own memory tier or from the pod that holds its peer
replica, and committed steps under root. Newest first (local before persistent for the same step),
each rank reads its own shard, checking sizes and CRC32, and one MIN all-reduce says whether all
could; a torn or corrupt shard anywhere moves every rank to the next candidate together. Resuming
needs the world size the checkpoint was written with (checked). Local snapshots newer than the
loaded step are deleted: they belong to a timeline that was abandoned.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import torch

from ..checkpoint_format import CheckpointError, WorldSizeMismatch, latest_valid
from ..peer_replica import ReplicaError, fetch_snapshot, held_replicas
from .agreement import RankAgreement
from .events import CheckpointEvent, EventLog, now
from .memory_tier import MemoryTier
from .optimizer_state import warm
from .persistent import PersistentTier, Shard
from .state_tree import load_state

log = logging.getLogger(__name__)

SOURCE_LOCAL = "local"
SOURCE_PERSISTENT = "persistent"
#: A memory snapshot fetched from the pod holding this rank's replica (rtj_trainer.peer_replica).
SOURCE_PEER = "peer"


@dataclass(frozen=True)
class Resumed:
    step: int
    extra: dict[str, Any]
    #: SOURCE_LOCAL (the node-local memory tier), SOURCE_PEER (memory snapshots, one rank's at least
    #: fetched from the pod holding its replica) or SOURCE_PERSISTENT (root).
    source: str = SOURCE_PERSISTENT
    #: Where the load's seconds went: agreeing on the candidates, making a fresh optimizer's state
    #: while a prefetch still runs ("warm", `optimizer_state.warm`), reading this rank's shard
    #: (mapping it, or copying it to the GPU), putting it into the model and optimizer ("state"),
    #: noting the tiers' steps, freeing the GPU buffer.
    seconds: dict[str, float] = field(default_factory=dict)


#: What one rank tells the others: (its memory snapshots, its committed steps, the replicas its pod
#: holds {rank: [(step, nonce)]}, its pod's replica server).
RankView = tuple[list[tuple[int, int]], list[int], dict[int, list[tuple[int, int]]], str | None]


@dataclass(frozen=True)
class Candidates:
    local: dict[int, int]  # step -> nonce of memory snapshots every rank can get
    persistent: set[int]  # committed steps some rank sees
    holders: dict[tuple[int, int], str]  # (step, nonce) -> the server holding this rank's replica


def agree_on_candidates(views: list[RankView], rank: int) -> Candidates:
    """The candidates every rank computes alike from all ranks' views (pure)."""
    # Found by what a pod holds, not by which pod a rank is on now: (rank, step, nonce) -> server.
    holders: dict[tuple[int, int, int], str] = {}
    for _, _, held_by, endpoint in views:
        for r, snaps in held_by.items():
            for s, n in snaps:
                holders.setdefault((int(r), int(s), int(n)), endpoint)  # type: ignore[arg-type]
    gettable = [
        set(map(tuple, loc)) | {(s, n) for (rr, s, n) in holders if rr == r}
        for r, (loc, _, _, _) in enumerate(views)
    ]
    common = set.intersection(*gettable)
    local = {step: nonce for step, nonce in sorted(common)}  # a step saved twice with one nonce cannot occur
    persistent = set().union(*(set(p) for _, p, _, _ in views))
    mine = {(s, n): ep for (rr, s, n), ep in holders.items() if rr == rank}
    return Candidates(local, persistent, mine)


class ResumeSelection:
    def __init__(
        self,
        agreement: RankAgreement,
        persistent: PersistentTier,
        memory: MemoryTier | None,
        replica_endpoint: str | None,
        events: EventLog,
    ) -> None:
        self._agreement = agreement
        self._persistent = persistent
        self._memory = memory
        self._replica_endpoint = replica_endpoint
        self._events = events
        self._holders: dict[tuple[int, int], str] = {}

    def load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Resumed | None:
        try:
            return self._load_latest(model, optimizer)
        finally:
            if self._memory is not None and self._memory.device is not None:
                self._memory.device.discard_prefetch()  # a prefetch of a snapshot not resumed from

    def _load_latest(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> Resumed | None:
        t = time.perf_counter()
        seconds: dict[str, float] = {}

        def took(phase: str) -> None:
            nonlocal t
            now_ = time.perf_counter()
            seconds[phase] = round(seconds.get(phase, 0.0) + now_ - t, 4)
            t = now_

        cands = self._candidates()
        self._holders = cands.holders
        local, persistent = cands.local, cands.persistent
        took("candidates")
        warmed = optimizer is not None and bool(local) and self._prefetch_pending() and warm(optimizer)
        if warmed:
            took("warm")  # the optimizer's state made, its kernels run, while the snapshot arrives
        for step in sorted(set(local) | persistent, reverse=True):
            tiers = ([SOURCE_LOCAL] if step in local else []) + (
                [SOURCE_PERSISTENT] if step in persistent else []
            )
            for source in tiers:
                shard, used = self._read_candidate(step, local.get(step, 0), source)
                ok, no_peer = self._agreement.all_min(
                    1 if shard is not None else 0, 0 if used == SOURCE_PEER else 1
                )
                took("read")
                if ok == 1:
                    assert shard is not None
                    used = SOURCE_PEER if no_peer == 0 else source
                    resumed = self._apply(model, optimizer, step, used, shard, took)
                    del shard
                    self._release_device_buffer()
                    took("release")
                    return replace(resumed, seconds=seconds)
        if self._memory is not None:
            self._memory.drop_after(-1)
        if warmed:  # nothing loaded: training starts afresh, as from an optimizer with no state
            assert optimizer is not None
            optimizer.state.clear()
        return None

    def _prefetch_pending(self) -> bool:
        """Whether a memory snapshot is still on its way to the GPU (`DeviceStage.prefetch`)."""
        device = self._memory.device if self._memory is not None else None
        return device is not None and device.prefetched is not None and device.prefetched.pending

    def _release_device_buffer(self) -> None:
        """A memory snapshot loaded through a GPU buffer (`device_stage`): give that memory back to
        the driver, so that whether a staging buffer fits is judged after training's first steps."""
        device = self._memory.device if self._memory is not None else None
        if device is not None and device.ops.active():
            device.ops.release()

    def _candidates(self) -> Candidates:
        mine_local: list[tuple[int, int]] = []
        held: dict[int, list[tuple[int, int]]] = {}
        if self._memory is not None:
            mine_local = self._memory.snapshots()
            if self._replica_endpoint:
                held = held_replicas(self._memory.local_root)
        view: RankView = (mine_local, self._persistent.steps(), held, self._replica_endpoint)
        return agree_on_candidates(self._agreement.all_gather(view), self._agreement.rank)

    def _read_candidate(self, step: int, nonce: int, source: str) -> tuple[Shard | None, str]:
        """(this rank's shard of the candidate or None, where it came from: a memory candidate is
        read from this rank's own snapshot, else (or when that fails) fetched from its replica)."""
        if source != SOURCE_LOCAL:
            return self._read_tier(step, nonce, source), source
        memory = self._memory
        assert memory is not None
        if memory.has(step, nonce) and (shard := self._read_tier(step, nonce, SOURCE_LOCAL)) is not None:
            return shard, SOURCE_LOCAL
        endpoint = self._holders.get((step, nonce))
        if endpoint is None:
            return None, SOURCE_LOCAL
        try:
            fetch_snapshot(endpoint, memory.rank, step, nonce, memory.dir)
        except (OSError, ReplicaError, CheckpointError, ValueError, KeyError, TypeError) as e:
            log.warning("could not fetch the replica of step %d from %s: %r", step, endpoint, e)
            return None, SOURCE_PEER
        return self._read_tier(step, nonce, SOURCE_LOCAL), SOURCE_PEER

    def _read_tier(self, step: int, nonce: int, source: str) -> Shard | None:
        try:
            if source == SOURCE_LOCAL:
                assert self._memory is not None
                return self._memory.read(step, nonce)
            return self._persistent.read(step)
        except WorldSizeMismatch:
            raise
        except (CheckpointError, OSError) as e:
            log.warning("skipping %s snapshot of step %d: %s", source, step, e)
            if source == SOURCE_PERSISTENT:
                self._events.fault(step, "CheckpointUnreadable", str(e))
            return None

    def _apply(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        step: int,
        source: str,
        shard: Shard,
        took: Callable[[str], None],
    ) -> Resumed:
        manifest, (skeleton, loaded) = shard
        state = load_state(model, optimizer, skeleton, loaded, mapped=source != SOURCE_PERSISTENT)
        took("state")
        if self._memory is not None:
            self._memory.drop_after(step)
        if source == SOURCE_PERSISTENT:
            # The pod's heartbeat (and NVRx's iteration file) should name the checkpoint it runs from.
            with contextlib.suppress(ValueError):
                self._events.put(CheckpointEvent("committed", step, datetime.fromisoformat(manifest.time)))
        else:
            self._events.put(CheckpointEvent("snapshot", step, now()))
            newest = latest_valid(self._persistent.root)
            if (
                newest is not None and self._events.last_committed is None
            ):  # what is persisted, for the heartbeat
                with contextlib.suppress(CheckpointError, ValueError):
                    self._events.put(
                        CheckpointEvent("committed", newest, self._persistent.committed_time(newest))
                    )
        took("tiers")
        return Resumed(step=step, extra=dict(state.get("extra") or manifest.extra), source=source)
