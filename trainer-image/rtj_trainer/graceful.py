"""A graceful stop (SIGTERM: node drain, spot notice, suspend, delete) that all ranks agree on.

The pod's entrypoint forwards SIGTERM to ft_launcher, which forwards it to every rank and kills
them after its `--term-timeout` (the pod's grace period less a margin). A rank must not die at
once: it finishes its step, and all ranks stop *at the same step* so that the emergency save
(`CheckpointManager.emergency_save`) is one consistent checkpoint. Ranks receive the signal at
slightly different moments, so `agreed()` is one tiny MAX all-reduce per step on a CPU (gloo)
group (tens of microseconds), after which every rank knows the same answer.

    stop = GracefulStop.install()
    for step in ...:
        ...train one step...
        if stop.agreed(group):
            ckpt.emergency_save(step + 1, model, optim)
            return STOPPED        # the rank exits with ExitCode.TERMINATED
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import torch
import torch.distributed as dist


class GracefulStop:
    def __init__(self) -> None:
        self._requested = threading.Event()
        self.signal_name: str | None = None

    @classmethod
    def install(cls, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> GracefulStop:
        """Handle `signals` in this process (call from the main thread, before training)."""
        stop = cls()
        for sig in signals:
            signal.signal(sig, stop._on_signal)
        return stop

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signal_name = signal.Signals(signum).name
        self._requested.set()

    def request(self) -> None:
        self._requested.set()

    @property
    def requested(self) -> bool:
        """This rank received the signal."""
        return self._requested.is_set()

    def agreed(self, group: Any = None) -> bool:
        """Whether any rank received the signal; the same answer on every rank (a collective:
        every rank calls it at the same steps)."""
        flag = int(self._requested.is_set())
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return bool(flag)
        t = torch.tensor([flag], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())
