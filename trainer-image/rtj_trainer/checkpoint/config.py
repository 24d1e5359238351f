"""The checkpoint settings, read once: from the rank's environment (`from_rank_env`) or given.

Each setting keeps the name it has end to end (spec -> TrainerConfig -> RTJ_* variable -> RankEnv
-> here) where it has one: `checkpoint_dir`, `checkpoint_interval_steps`, `checkpoints_to_keep`,
`memory_snapshot_interval_steps`, `memory_snapshot_gpu_staging`; `memory_tier_root` is
`RankEnv.memory_tier_root()` (the job's directory in the memory volume) and the two endpoints are
`RankEnv.peer_replica()`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from ..runtime_env import RankEnv

#: Threads copying a memory snapshot from the host buffers (or the GPU staging's pinned chunks) into
#: the memory tier, each one memmove at a time (`device_stage.copy_bytes`), beside training. One
#: drained 13.7 GB in 1.07-1.55 s on H100 hosts (a 10-step interval is 1.8 s there), four in
#: 0.70-0.95 s, but every copy thread more took throughput from training, even in the pod's slot
#: copier (another process): with a persist every 40 steps, one H100 host kept 0.946-0.987 of the
#: throughput without snapshots with four threads (six runs) and 0.981-1.0005 with one (four runs;
#: 1xH100, 2026-12-07, bench/results/2026-12-07-slot-prepare-h100.md); on the CPU stand-in (2 cores,
#: bench/drain_interference.py) the main thread kept a median 0.95 of its rate of small torch ops
#: with one thread, 0.68 with four. A restarted rank's load, with nothing to share the CPU with,
#: uses more (`device_stage.LOAD_THREADS`).
DEFAULT_LOCAL_WRITE_THREADS = 1


@dataclass(frozen=True)
class CheckpointConfig:
    checkpoint_dir: str
    rank: int
    world_size: int
    checkpoint_interval_steps: int
    checkpoints_to_keep: int = 2
    #: Seconds rank 0 waits for every rank's shard before it abandons a commit.
    commit_timeout_s: float = 600.0
    #: Throttle of the persistent writes (tests and benchmarks: "storage slower than the interval").
    write_bytes_per_s: float | None = None
    #: The memory tier: one directory per rank under it (None: off).
    memory_tier_root: str | None = None
    memory_snapshot_interval_steps: int = 0
    memory_snapshots_to_keep: int = 2
    memory_snapshot_write_threads: int = DEFAULT_LOCAL_WRITE_THREADS
    #: Stage each memory snapshot on the GPU where it has room (`device_stage.DeviceStage`); False:
    #: always the device-to-host copy into pinned host memory, no GPU memory taken for it.
    memory_snapshot_gpu_staging: bool = True
    #: Widen the memory interval to what the measured write fits in (`schedule.snapshot_every`).
    adapt_memory_snapshot_interval: bool = False
    #: The peer replica (both need the memory tier): the server this rank's snapshots are streamed
    #: to, and this pod's own server (the replicas it holds for other ranks, offered at resume).
    peer_endpoint: str | None = None
    replica_endpoint: str | None = None

    def __post_init__(self) -> None:
        counts = (
            self.checkpoint_interval_steps,
            self.checkpoints_to_keep,
            self.memory_snapshots_to_keep,
            self.memory_snapshot_write_threads,
        )
        if min(counts) < 1:
            raise ValueError("interval_steps, keep, local_keep and local_write_threads must be >= 1")
        if self.memory_tier_root is not None and self.memory_snapshot_interval_steps < 1:
            raise ValueError("local_interval_steps must be >= 1 with a local_root")
        set_ = object.__setattr__
        set_(self, "checkpoint_dir", os.path.abspath(self.checkpoint_dir))
        if self.memory_tier_root is not None:
            set_(self, "memory_tier_root", os.path.abspath(self.memory_tier_root))
        else:
            set_(self, "peer_endpoint", None)
            set_(self, "replica_endpoint", None)

    @property
    def memory_tier(self) -> bool:
        return self.memory_tier_root is not None

    @classmethod
    def of_arguments(
        cls,
        root: str,
        rank: int,
        world_size: int,
        interval_steps: int,
        keep: int,
        commit_timeout_s: float,
        write_bytes_per_s: float | None,
        local_root: str | None,
        local_interval_steps: int | None,
        local_keep: int,
        local_write_threads: int,
        adapt_local_interval: bool,
        peer_endpoint: str | None,
        replica_endpoint: str | None,
        memory_snapshot_gpu_staging: bool,
    ) -> CheckpointConfig:
        """From `CheckpointManager`'s keyword arguments (the names it has always taken)."""
        return cls(
            checkpoint_dir=root,
            rank=rank,
            world_size=world_size,
            checkpoint_interval_steps=interval_steps,
            checkpoints_to_keep=keep,
            commit_timeout_s=commit_timeout_s,
            write_bytes_per_s=write_bytes_per_s,
            memory_tier_root=local_root or None,
            memory_snapshot_interval_steps=local_interval_steps or 0,
            memory_snapshots_to_keep=local_keep,
            memory_snapshot_write_threads=local_write_threads,
            memory_snapshot_gpu_staging=memory_snapshot_gpu_staging,
            adapt_memory_snapshot_interval=adapt_local_interval,
            peer_endpoint=peer_endpoint,
            replica_endpoint=replica_endpoint,
        )

    @classmethod
    def from_rank_env(cls, env: RankEnv | None = None, **overrides: Any) -> CheckpointConfig:
        """The settings of this rank's environment (`RankEnv.from_env()`), with `overrides`."""
        env = env if env is not None else RankEnv.from_env()
        root = env.memory_tier_root()
        replica = env.peer_replica() if root else None
        cfg = cls(
            checkpoint_dir=env.checkpoint_dir,
            rank=env.rank,
            world_size=env.world_size,
            checkpoint_interval_steps=env.checkpoint_interval_steps,
            checkpoints_to_keep=env.checkpoints_to_keep,
            memory_tier_root=root,
            memory_snapshot_interval_steps=env.memory_snapshot_interval_steps if root else 0,
            memory_snapshot_gpu_staging=env.memory_snapshot_gpu_staging,
            adapt_memory_snapshot_interval=True,
            replica_endpoint=replica[0] if replica else None,
            peer_endpoint=replica[1] if replica else None,
        )
        return dataclasses.replace(cfg, **overrides) if overrides else cfg
