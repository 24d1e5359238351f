"""Asynchronous checkpoints with an atomic cross-rank commit that never stall training on storage.

What training waits for (the stall) is only a snapshot of the rank's state (`staging`): model +
optimizer local shards (FSDP2 DTensors are saved as their local tensors) copied, with the memory
tier on a GPU that has room for it, into one GPU buffer (`device_stage`: a device-to-device copy,
milliseconds; given back for good if training runs out of GPU memory,
`CheckpointManager.stop_gpu_staging`), else into reused, pinned host buffers on a side CUDA stream,
which the training stream waits for only right before the next `optimizer.step()` (a plain copy on
CPU). A background
thread then brings it to the host, writes the files and commits (`writer`); training never joins it.

At a due step all ranks agree, with one tiny all-reduce on a CPU (gloo) group in the training loop
(`agreement`), whether to save (nobody's previous save is still draining) and on a nonce naming
the save. The persistent tier (`persistent`) writes each rank's shard under root and rank 0
commits the step with one rename once every rank's shard is there; a crash at any point leaves
every earlier step intact. If a save is due while the previous one is still being written, it is
skipped, reported and coalesced (`schedule`): a slow store costs recency, never training time.
Commits are reported from the training thread (`poll`, called by `maybe_save`) to the rank's
`RankReporter` (the pod's heartbeat, NVRx's checkpoint iteration file).

The node-local memory tier (`memory_tier`, a tmpfs such as the pod's /dev/shm, with its own
interval) commits each snapshot per rank with one rename at memory speed; persistence then copies
a committed snapshot to root from a second thread, in a child process (`checkpoint_copy`: off the
rank's GIL), so a slow store never holds up the memory tier.
Each committed snapshot may be streamed to another pod (`replication`, `rtj_trainer.peer_replica`).
A restart resumes from the newest step that every rank can load, from its memory, a peer's memory
or root (`resume`). `emergency_save` (SIGTERM, a graceful stop) abandons an in-flight persist and
replica stream of an older step, snapshots the current step into memory, replicates and persists it
at once, and returns when it committed or at the pod's deadline, saying which tiers hold the step
(`EmergencySave`).

Why not torch DCP or NVRx async checkpointing (measured on 2xH200 on 2026-11-30, FSDP2 with 6.85 GB
of state per rank; docs/benchmarks.md, "Checkpoint stall"): DCP `save` blocks for the whole write
(11-14 s per save); DCP `async_save` still stalls 5.2 s (planning collectives + unpinned staging copy)
and 10-12 s when the previous save has not finished, because it waits for it. NVRx 0.4.1's persistent
async queue saved wrong data on CPU (a race); the NVRx 0.7 stock path hung on FSDP2 and its
worker processes outlived crashed ranks. A thread in the rank cannot be orphaned, needs no
pickling of the state, and the skip/coalesce rule bounds what training ever waits for by the copy.
Resume needs the same world size (each rank reads its own shard); that is checked and refused
with a clear error otherwise. NVRx 0.7's `checkpointing.local.LocalCheckpointManager` was read and
not used for the memory tier: its BasicTensorAwareStateDict requires CUDA tensors (our CPU path and
tests), it allocates new CPU copies per save instead of reusing pinned buffers, stores each shard
with `torch.save` and loads it with `torch.load(weights_only=False)` (unpickling code) without
checksums, and its async save needs the AsyncCallsQueue that hung on FSDP2 (FACTS.md).

This module is the facade: every name below is importable from `rtj_trainer.checkpoint`.
"""

from __future__ import annotations

from ..checkpoint_format import CheckpointError, latest_valid
from .config import DEFAULT_LOCAL_WRITE_THREADS, CheckpointConfig
from .events import CheckpointEvent, Reporter
from .manager import CheckpointManager, EmergencySave
from .resume import SOURCE_LOCAL, SOURCE_PEER, SOURCE_PERSISTENT, Resumed
from .schedule import MAX_SNAPSHOT_WIDENING, SNAPSHOT_WRITE_MARGIN, snapshot_every
from .shard_io import map_shard as _map_shard
from .shard_io import read_shard
from .state_tree import flatten as _flatten
from .state_tree import state_of as _state_of
from .state_tree import unflatten as _unflatten

__all__ = [
    "DEFAULT_LOCAL_WRITE_THREADS",
    "MAX_SNAPSHOT_WIDENING",
    "SNAPSHOT_WRITE_MARGIN",
    "SOURCE_LOCAL",
    "SOURCE_PEER",
    "SOURCE_PERSISTENT",
    "CheckpointConfig",
    "CheckpointError",
    "CheckpointEvent",
    "CheckpointManager",
    "EmergencySave",
    "Reporter",
    "Resumed",
    "_flatten",
    "_map_shard",
    "_state_of",
    "_unflatten",
    "latest_committed",
    "read_shard",
    "snapshot_every",
]


def latest_committed(root: str, *, world_size: int | None = None) -> int | None:
    """Newest committed step under root whose manifest validates, or None (partials never count)."""
    return latest_valid(root, world_size=world_size)
