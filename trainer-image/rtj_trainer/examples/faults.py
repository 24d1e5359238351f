"""Fault injection for the examples and tests, env `RTJ_FAULT_INJECT`: `;`-separated items
`<kind>:<rank>:<step>[:always][:delay=S]` (the kinds: rtj_trainer.examples.fsdp_train's docstring).
A step "+N" counts from the step the run resumed at. Each fault fires once per job (a marker file
`.fault-*` in the state dir, the checkpoint directory) unless `:always` is given."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

ENV_FAULT_INJECT = "RTJ_FAULT_INJECT"
FAULT_KINDS = ("exception", "sigkill", "hang", "stall", "exit", "finish", "kill-during-save", "corrupt")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    relative: bool = False
    always: bool = False
    delay: float = 0.05

    @property
    def key(self) -> str:
        return f".fault-{self.kind}-{self.rank}-{'+' if self.relative else ''}{self.step}"


def parse_faults(spec: str | None) -> list[Fault]:
    """`<kind>:<rank>:<step>[:always][:delay=S]` items separated by `;` (module docstring)."""
    faults: list[Fault] = []
    for item in (spec or "").split(";"):
        parts = [p.strip() for p in item.strip().split(":")] if item.strip() else []
        if not parts:
            continue
        if len(parts) < 3 or parts[0] not in FAULT_KINDS:
            raise ValueError(
                f"{ENV_FAULT_INJECT}: {item!r} is not <kind>:<rank>:<step>[:always][:delay=S] "
                f"with kind one of {', '.join(FAULT_KINDS)}"
            )
        opts = parts[3:]
        delay = next((float(o.split("=", 1)[1]) for o in opts if o.startswith("delay=")), 0.05)
        faults.append(
            Fault(
                parts[0],
                int(parts[1]),
                int(parts[2].lstrip("+")),
                parts[2].startswith("+"),
                "always" in opts,
                delay,
            )
        )
    return faults


class FaultInjector:
    """Fires the faults meant for this rank; each once per job unless `always` (marker files)."""

    def __init__(
        self, faults: list[Fault], rank: int, state_dir: str, note: Callable[..., None] | None = None
    ) -> None:
        self.faults = [f for f in faults if f.rank == rank]
        self.state_dir = state_dir
        self.start_step = 0
        #: Records each fault (kind, step, wall time) before it fires: benchmarks time from it.
        self.note = note or (lambda **_: None)

    def _due(self, fault: Fault, step: int) -> bool:
        if step != (self.start_step + fault.step if fault.relative else fault.step):
            return False
        if fault.always:
            return True
        os.makedirs(self.state_dir, exist_ok=True)
        try:
            os.close(os.open(os.path.join(self.state_dir, fault.key), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    def before_step(self, step: int, model: Any = None) -> None:
        for f in self.faults:
            if f.kind == "kill-during-save" or not self._due(f, step):
                continue
            print(f"[rtj faults] injecting {f.kind} before step {step} (pid {os.getpid()})", flush=True)
            self.note(event="fault", kind=f.kind, step=step, t=time.time())
            if f.kind == "corrupt" and model is not None:
                with torch.no_grad():
                    next(model.parameters()).to_local().fill_(float("nan"))
                raise RuntimeError(f"injected corruption at step {step}")
            if f.kind == "exception":
                raise RuntimeError(f"injected exception at step {step}")
            if f.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if f.kind == "exit":
                os._exit(1)
            if f.kind == "finish":
                os._exit(0)
            if f.kind == "stall":
                # No progress, but interruptible (a Python loop, like a rank waiting on a peer that
                # never comes): the learned hang budget aborts it and restarts in-process.
                while True:
                    time.sleep(0.05)
            if f.kind == "hang":
                # Block inside a system call (a read that never delivers): the learned hang
                # budget's abort reaches it through a signal (nvrx_patches.apply_interrupting_abort)
                # and restarts it in-process; else NVRx's heartbeat or hard timeout.
                r, _w = os.pipe()
                os.read(r, 1)

    def after_save(self, step: int) -> None:
        for f in self.faults:
            if f.kind == "kill-during-save" and self._due(f, step):
                print(f"[rtj faults] SIGKILL {f.delay} s into the save of step {step}", flush=True)
                self.note(event="fault", kind=f.kind, step=step, t=time.time())
                time.sleep(f.delay)
                os.kill(os.getpid(), signal.SIGKILL)
