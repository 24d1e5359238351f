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
            stop.saving()
            ckpt.emergency_save(step + 1, model, optim)
            os._exit(ExitCode.TERMINATED)

ft_launcher also sends SIGTERM to the surviving ranks when it restarts the workers after a rank
failed (an in-job restart). There is nothing to save then (a peer is gone, the step cannot
complete), and the rank must go at once, as it did without a handler. The entrypoint tells the two
apart: it writes `GRACEFUL_STOP_FILE` into the pod's status dir before it forwards its own SIGTERM;
a SIGTERM without that file takes the default action at once. Outside the trainer runtime (no
status dir) every SIGTERM is a graceful stop. As a safety net, `died_with_peer()` turns a training
exception after the signal into an immediate exit, and a rank that has not begun its emergency save
`give_up_after_s` seconds after the signal exits from a timer.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch
import torch.distributed as dist
from rtj.contract import ExitCode

from .runtime_env import GRACEFUL_STOP_FILE

#: Seconds after the signal by which the ranks must have agreed to stop and begun saving.
DEFAULT_GIVE_UP_AFTER_S = 5.0


class GracefulStop:
    def __init__(
        self, give_up_after_s: float = DEFAULT_GIVE_UP_AFTER_S, status_dir: str | None = None
    ) -> None:
        self._requested = threading.Event()
        self.give_up_after_s = give_up_after_s
        self._marker = os.path.join(status_dir, GRACEFUL_STOP_FILE) if status_dir else None
        self.signal_name: str | None = None
        self._timer: threading.Timer | None = None

    @classmethod
    def install(
        cls,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM,),
        give_up_after_s: float = DEFAULT_GIVE_UP_AFTER_S,
        status_dir: str | None = None,
    ) -> GracefulStop:
        """Handle `signals` in this process (call from the main thread, before training);
        `status_dir`: the pod's (RankEnv.status_dir), where the entrypoint marks a graceful stop."""
        stop = cls(give_up_after_s, status_dir)
        for sig in signals:
            signal.signal(sig, stop._on_signal)
        return stop

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self._marker is not None and not os.path.exists(self._marker):
            signal.signal(signum, signal.SIG_DFL)  # ft_launcher restarts the workers: go now
            os.kill(os.getpid(), signum)
            return
        self.signal_name = signal.Signals(signum).name
        if self._requested.is_set():
            return
        self._requested.set()
        self._timer = threading.Timer(self.give_up_after_s, _exit_terminated)
        self._timer.daemon = True
        self._timer.start()

    def saving(self) -> None:
        """The ranks agreed to stop and the emergency save begins: no more give-up timer (the
        launcher's term timeout bounds the save)."""
        if self._timer is not None:
            self._timer.cancel()

    def died_with_peer(self) -> None:
        """Call when training raised: after the signal that means a peer is gone; exit now."""
        if self._requested.is_set():
            _exit_terminated()

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


def _exit_terminated() -> None:
    os._exit(ExitCode.TERMINATED)
