"""The parts one `CheckpointManager` is made of, built from its `CheckpointConfig`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..slot_copier import CopierClient, socket_path
from .agreement import RankAgreement
from .config import CheckpointConfig
from .device_stage import DeviceStage
from .events import CheckpointEvent, EventLog, Reporter
from .memory_tier import MemoryTier
from .persistent import PersistentTier
from .replication import ReplicationHook
from .resume import ResumeSelection
from .schedule import SaveSchedule
from .shard_io import WriteControl
from .snapshot_ring import SnapshotRing
from .staging import HostStaging
from .writer import SnapshotWriter


@dataclass
class Parts:
    events: EventLog
    control: WriteControl
    agreement: RankAgreement
    staging: HostStaging
    schedule: SaveSchedule
    persistent: PersistentTier
    memory: MemoryTier | None
    #: The memory tier's files as the staging's host buffers (snapshots at copy speed).
    ring: SnapshotRing | None
    replication: ReplicationHook | None
    writer: SnapshotWriter
    resume: ResumeSelection

    def protected(self) -> tuple[str | None, ...]:
        """Memory snapshots kept whatever their age: being persisted, being replicated, replicated last."""
        replica = self.replication.protected() if self.replication is not None else ()
        return (self.persistent.persist_source, *replica)

    def set_world_size(self, world_size: int) -> None:
        for part in (self.agreement, self.persistent, self.memory):
            if part is not None:
                part.world_size = world_size


def wants_device_stage(cfg: CheckpointConfig, cuda_available: bool) -> bool:
    """Whether the memory tier gets a `DeviceStage` (it stages a snapshot on the GPU only where it
    also fits there after the first step): with CUDA, unless the config turns GPU staging off."""
    return cfg.memory_tier and cfg.memory_snapshot_gpu_staging and cuda_available


def build_parts(
    cfg: CheckpointConfig,
    group: Any,
    reporter: Reporter | None,
    on_event: Callable[[CheckpointEvent], None] | None,
) -> Parts:
    events = EventLog(reporter, on_event)
    control = WriteControl(cfg.write_bytes_per_s)
    agreement = RankAgreement(cfg.rank, cfg.world_size, group)
    schedule = SaveSchedule(
        cfg.checkpoint_interval_steps,
        cfg.memory_snapshot_interval_steps,
        memory=cfg.memory_tier,
        adapt=cfg.adapt_memory_snapshot_interval,
    )
    persistent = PersistentTier(
        cfg.checkpoint_dir,
        rank=cfg.rank,
        world_size=cfg.world_size,
        keep=cfg.checkpoints_to_keep,
        commit_timeout_s=cfg.commit_timeout_s,
        control=control,
        events=events,
    )
    memory: MemoryTier | None = None
    replication: ReplicationHook | None = None
    ring: SnapshotRing | None = None
    device: DeviceStage | None = None
    if cfg.memory_tier_root is not None:
        memory = MemoryTier(
            cfg.memory_tier_root,
            rank=cfg.rank,
            world_size=cfg.world_size,
            keep=cfg.memory_snapshots_to_keep,
            write_threads=cfg.memory_snapshot_write_threads,
            control=control,
            events=events,
        )
        if cfg.peer_endpoint:
            replication = ReplicationHook(cfg.peer_endpoint, cfg.rank, memory.lock, events)
        copier_path = socket_path(cfg.memory_tier_root)

        def copier() -> CopierClient | None:
            return CopierClient.connect(copier_path)

        ring = memory.ring = SnapshotRing(memory, copier=copier)
        if wants_device_stage(cfg, torch.cuda.is_available()) and not memory.gpu_staging_refused:
            device = memory.device = DeviceStage(
                cfg.memory_snapshot_write_threads, copier=ring.copier, file_of=ring.file_of
            )
    parts = Parts(
        events=events,
        control=control,
        agreement=agreement,
        staging=HostStaging(ring, device),
        schedule=schedule,
        persistent=persistent,
        memory=memory,
        ring=ring,
        replication=replication,
        writer=SnapshotWriter(persistent, memory, replication, control),
        resume=ResumeSelection(agreement, persistent, memory, cfg.replica_endpoint, events),
    )
    if memory is not None:
        memory.protected = parts.protected
    return parts
