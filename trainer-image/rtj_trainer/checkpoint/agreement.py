"""What the ranks agree on, with one tiny collective each on the CPU (gloo) group, in the training loop.

No collective ever runs in a background thread: a save is agreed (`agree_on_save`) before any
thread starts, and a resume's candidates are agreed step by step (`all_gather`, `all_min`).
With one rank (or no process group) every call answers from this rank's own values.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SaveAgreement:
    """What every rank learns at a due step."""

    any_busy: bool  # some rank's host buffers are still being written out
    any_persisting: bool  # some rank's persist to root is still draining
    any_replicating: bool  # some rank's replicator is still streaming
    nonce: int  # rank 0's random name of this save (odd, so never 0)
    write_s: float  # the slowest memory-tier write
    step_s: float  # the fastest step time; 0 = unknown on some rank


class RankAgreement:
    def __init__(self, rank: int, world_size: int, group: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group

    def _collective(self) -> bool:
        if self.world_size <= 1:
            return False
        if self.group is not None:
            return True
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def agree_on_save(
        self, *, busy: bool, persisting: bool, replicating: bool, write_s: float, step_s: float
    ) -> SaveAgreement:
        """One MAX all-reduce of this rank's figures (and rank 0's nonce)."""
        nonce = random.getrandbits(31) | 1 if self.rank == 0 else 0
        write_us, step_us = int(write_s * 1e6), int(step_s * 1e6)
        if not self._collective():
            return SaveAgreement(busy, persisting, replicating, nonce or 1, write_us / 1e6, step_us / 1e6)
        import torch.distributed as dist

        # MAX of -step: the fastest step; a rank that has none yet (0) makes it unknown (0).
        t = torch.tensor(
            [int(busy), int(persisting), int(replicating), nonce, write_us, -step_us], dtype=torch.int64
        )
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return SaveAgreement(bool(t[0]), bool(t[1]), bool(t[2]), int(t[3]), int(t[4]) / 1e6, -int(t[5]) / 1e6)

    def all_min(self, *values: int) -> tuple[int, ...]:
        if not self._collective():
            return values
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return tuple(int(x) for x in t.tolist())

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order."""
        if not self._collective():
            return [obj]
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered
