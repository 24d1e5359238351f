"""A graceful stop (SIGTERM: node drain, spot notice, suspend, delete) that all ranks agree on.

The pod's entrypoint forwards SIGTERM to ft_launcher, which forwards it to every rank and kills
them after its `--term-timeout` (the pod's grace period less a margin). A rank must not die at
once: it finishes its step, and all ranks stop *at the same step* so that the emergency save
(`CheckpointManager.emergency_save`) is one consistent checkpoint. Ranks receive the signal at
slightly different moments, so `agreed()` is one tiny MAX all-reduce per step on a CPU (gloo)
group (tens of microseconds), after which every rank knows the same answer.

    stop = GracefulStop.install(status_dir=env.status_dir)
    for step in ...:
        ...train one step...
        if stop.agreed(group):
            stop.save_and_exit(ckpt, step + 1, model, optim, group=group, reporter=reporter, log=log)

ft_launcher also sends SIGTERM to the surviving ranks when it restarts the workers after a rank
failed (an in-job restart). There is nothing to save then (a peer is gone, the step cannot
complete), and the rank must go at once, as it did without a handler. The entrypoint tells the two
apart: it writes `GRACEFUL_STOP_FILE` into the pod's status dir before it forwards its own SIGTERM;
a SIGTERM without that file takes the default action at once. Outside the trainer runtime (no
status dir) every SIGTERM is a graceful stop.

The file holds the wall-clock deadline by which the ranks must have exited (the launcher's SIGKILL
less `runtime_env.GRACEFUL_STOP_EXIT_MARGIN_S`), read when the signal arrives (`deadline`,
`seconds_left`; `agreed` gives every rank the earliest one, a pod without a signal included): the
emergency save commits the step to memory first and waits for its replica and its persist only until
just before it, so a grace too short to persist still leaves the step in memory (and at the peer),
and the rank says which tiers hold it. A rank whose own pod is stopping (the mark is in its status
dir) does not persist at all: once the step is in memory (and at the peer) it leaves a record for
its pod's entrypoint, which persists the snapshot after the rank has exited, with the rest of the
grace period (`checkpoint.handoff`). As a safety net, `died_with_peer()` turns a training
exception after the signal into an immediate exit; a rank that has not begun its emergency save
`give_up_after_s` seconds after the signal exits from a timer, and so does one still here at its
deadline (the save not begun yet, or a collective after it that never returns).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from rtj.contract import ExitCode, PodState

from .checkpoint import CheckpointManager, EmergencySave
from .checkpoint.handoff import Handoff, write_handoff
from .runtime_env import GRACEFUL_STOP_FILE, stop_deadline

#: Seconds after the signal by which the ranks must have agreed to stop and begun saving.
DEFAULT_GIVE_UP_AFTER_S = 5.0
#: Seconds before the deadline by which the emergency save returns: the rank's exit after it (every
#: rank meeting at a barrier, its "stopped" record, os._exit) takes milliseconds.
EXIT_AFTER_SAVE_S = 0.25
_NO_DEADLINE = -(1 << 62)  # in `agreed`'s all-reduce: this rank has no deadline


class GracefulStop:
    def __init__(
        self, give_up_after_s: float = DEFAULT_GIVE_UP_AFTER_S, status_dir: str | None = None
    ) -> None:
        self._requested = threading.Event()
        self.give_up_after_s = give_up_after_s
        self._marker = os.path.join(status_dir, GRACEFUL_STOP_FILE) if status_dir else None
        self.signal_name: str | None = None
        #: Wall-clock time (`time.time()`) by which this rank must have exited; None: not known
        #: (no signal yet, no status dir, or an entrypoint that wrote none).
        self.deadline: float | None = None
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
        deadline = None
        if self._marker is not None:
            try:
                with open(self._marker) as f:
                    deadline = stop_deadline(f.read())
            except OSError:
                signal.signal(signum, signal.SIG_DFL)  # ft_launcher restarts the workers: go now
                os.kill(os.getpid(), signum)
                return
        self.signal_name = signal.Signals(signum).name
        if self._requested.is_set():
            return
        self.deadline = deadline
        self._requested.set()
        left = self.seconds_left()
        self._exit_after(self.give_up_after_s if left is None else min(self.give_up_after_s, left))

    def seconds_left(self) -> float | None:
        """Seconds until `deadline` (negative once past it); None without a deadline."""
        return None if self.deadline is None else self.deadline - time.time()

    def _exit_after(self, seconds: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        if seconds is not None:
            self._timer = threading.Timer(max(0.0, seconds), _exit_terminated)
            self._timer.daemon = True
            self._timer.start()

    def saving(self) -> None:
        """The ranks agreed to stop and the emergency save begins: no more give-up timer; with a
        deadline, the rank exits from a timer at the deadline if it is still here."""
        self._exit_after(self.seconds_left())

    def _handoff_to_pod(self, ckpt: CheckpointManager) -> Callable[[str], bool] | None:
        """When this rank's pod is being stopped by its entrypoint (its mark is there now, even if
        this rank learned of the stop from a peer first): what leaves a committed snapshot to the
        entrypoint to persist (`checkpoint.handoff`), tied to this stop by the deadline it wrote."""
        if self._marker is None:
            return None
        try:
            with open(self._marker) as f:
                pod_deadline = stop_deadline(f.read())
        except OSError:
            return None
        status_dir = os.path.dirname(self._marker)

        def leave(snapshot: str) -> bool:
            h = Handoff(
                rank=ckpt.rank,
                local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                snapshot=snapshot,
                root=ckpt.root,
                keep=ckpt.keep,
                stop_deadline=pod_deadline,
            )
            try:
                write_handoff(status_dir, h)
            except OSError as e:  # this rank persists the step itself
                print(f"[rtj] graceful stop: the persist could not be left to the pod: {e!r}", flush=True)
                return False
            return True

        return leave

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
        every rank calls it at the same steps). The ranks agree on the earliest deadline too: the
        pods of a job are signalled apart (a drain stops one), and a rank of a pod that got no
        signal must save and go by the deadline of the pod that did."""
        flag = int(self._requested.is_set())
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return bool(flag)
        # MAX of -deadline (milliseconds) is the earliest deadline; a rank without one never wins.
        mine = _NO_DEADLINE if self.deadline is None else -int(self.deadline * 1000)
        t = torch.tensor([flag, mine], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        if int(t[1]) != _NO_DEADLINE:
            self.deadline = -int(t[1]) / 1000
        return bool(t[0])

    def save_and_exit(
        self,
        ckpt: CheckpointManager | None,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        extra: dict[str, Any] | None = None,
        group: Any = None,
        reporter: Any = None,
        log: Callable[..., None] | None = None,
    ) -> NoReturn:
        """The end of an agreed stop, the same in every integration: the emergency save of `step` by
        the deadline, every rank met, a "stopped" record (`log`) and a line saying which tiers hold
        the step, then exit TERMINATED at once (never 0: not finished; the in-process wrapper's and
        the interpreter's teardown took 10 s of the grace period on CPU). `reporter`: the rank's
        RankReporter (state Checkpointing meanwhile)."""
        self.saving()
        if reporter is not None:
            reporter.state(PodState.CHECKPOINTING)
        t0 = time.time()
        deadline = None if self.deadline is None else self.deadline - EXIT_AFTER_SAVE_S
        saved = (
            ckpt.emergency_save(
                step,
                model,
                optimizer,
                extra=extra or {},
                deadline=deadline,
                handoff=self._handoff_to_pod(ckpt),
            )
            if ckpt is not None
            else EmergencySave(step, memory=False, replica=False, persisted=False)
        )
        with contextlib.suppress(Exception):
            dist.barrier(group=group)  # every rank's part is written (rank 0 returns once committed)
        seconds = round(time.time() - t0, 3)
        left = self.seconds_left()
        tiers = {
            "memory": saved.memory,
            "replica": saved.replica,
            "persisted": saved.persisted,
            "handed_off": saved.handed_off is not None,  # the pod's entrypoint persists it
        }
        if log is not None:
            log(event="stopped", step=step, **tiers, seconds=seconds,
                seconds_left=None if left is None else round(left, 3), t=time.time())  # fmt: skip
        held = " ".join(f"{name}={yes}" for name, yes in tiers.items())
        before = "" if left is None else f", {left:.1f} s before the deadline"
        print(f"[rtj] graceful stop at step {step}: {held} in {seconds} s{before}", flush=True)
        _exit_terminated()


def _exit_terminated() -> NoReturn:
    os._exit(ExitCode.TERMINATED)
