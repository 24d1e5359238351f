"""The writer thread: a snapshot in host memory -> the memory tier and/or the persistent tier.

Training never joins it. Without a memory tier it persists straight from the host buffers. With
one, it commits the memory snapshot (memory speed), offers it to the peer replica, and hands
persistence to the persister thread, which reads the committed memory snapshot: a slow store then
never holds up the memory tier. If the memory snapshot fails, a due persist is written from the
host buffers all the same.
"""

from __future__ import annotations

import threading

from .memory_tier import MemoryTier
from .persistent import PersistentTier
from .replication import ReplicationHook
from .shard_io import WriteControl, write_shard
from .staging import Snapshot


class SnapshotWriter:
    def __init__(
        self,
        persistent: PersistentTier,
        memory: MemoryTier | None,
        replication: ReplicationHook | None,
        control: WriteControl,
    ) -> None:
        self._persistent = persistent
        self._memory = memory
        self._replication = replication
        self._control = control
        self.thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def start(self, snap: Snapshot, persist: bool, fallback_persist: bool = False) -> None:
        """Write `snap`; `persist`: persist it too; `fallback_persist`: persist it only if its
        memory snapshot fails (an emergency save handing the persist to the pod's entrypoint)."""
        if self._memory is None:
            target, args = self._persist_from_host, (snap,)
        else:
            target, args = self._write_memory, (snap, persist, fallback_persist)  # type: ignore[assignment]
        self.thread = threading.Thread(
            target=target, args=args, name=f"rtj-ckpt-writer-{snap.step}", daemon=True
        )
        self.thread.start()

    def _persist_from_host(self, snap: Snapshot) -> None:
        rank = self._persistent.rank

        def produce(partial: str) -> dict:
            snap.wait_copied()
            return write_shard(partial, rank, snap.host, snap.tree, self._control)

        self._persistent.persist(snap.step, snap.nonce, snap.extra, produce)

    def _write_memory(self, snap: Snapshot, persist: bool, fallback_persist: bool = False) -> None:
        assert self._memory is not None
        final = self._memory.commit(snap) if snap.partial is not None else self._memory.write(snap)
        if final is None:
            if (persist or fallback_persist) and not snap.lost:  # else no complete state on the host
                self._persist_from_host(snap)
            return
        if self._replication is not None and snap.replicate:
            self._replication.offer(snap.step, snap.nonce, final)
        if persist:
            self._persistent.persist_in_background(snap.step, snap.nonce, snap.extra, final)
        self._memory.prune(protect=final)
