"""A tiny DDP/gloo training script for the trainer runtime tests (CPU, real processes).

It uses the same APIs as a real training script: RankEnv, RankReporter,
run_with_inprocess_restart. State: a small linear model; every `checkpointIntervalSteps` rank 0
writes `step-<n>.pt` atomically into RTJ_CHECKPOINT_DIR and every rank reports the commit; on
(re)start the newest checkpoint is loaded.

Test hooks (environment):
- TOY_EVENTS: a file to which every rank appends one JSON line per step
  ({"t", "rank", "step", "pid", "ppid", "ipr", "ijr"}): ppid = the launcher, ipr = in-process
  restart count of this call, ijr = TORCHELASTIC_RESTART_COUNT.
- TOY_STEPS (default: run forever), TOY_STEP_SECONDS (default 0.05).
- RTJ_FAULT_INJECT="<kind>:<rank>:<step>[:always]" (rank `*`: every rank that sees the variable,
  e.g. all ranks of one pod) with kind one of
  exception (raise: in-process restart), sigkill (SIGKILL itself: in-job restart),
  hang (block in a system call: the learned hang budget or the soft timeout aborts it in-process,
  or NVRx's heartbeat timeout first), stall (stop making progress in Python: the same),
  wedge (block in a system call with every signal masked, like a call into a driver that never
  returns: nothing reaches it, only NVRx's heartbeat timeout or the hard timeout), exit (os._exit(1)),
  permanent (raise rtj_trainer.permanent.PermanentError: no restart can fix it).
  Without ":always" the fault fires once per job (a marker file in the checkpoint dir);
  with it, every time the rank reaches that step after a (re)start, relative to the resumed step
  when the step is given as "+N".
"""

from __future__ import annotations

import gc
import glob
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from rtj.contract import PodState
from rtj_trainer.hang_timeouts import Section
from rtj_trainer.inprocess import run_with_inprocess_restart
from rtj_trainer.permanent import PermanentError
from rtj_trainer.rank_forkserver import ENV_LAUNCHER_PID
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv
from torch.nn.parallel import DistributedDataParallel


def _latest_checkpoint(ckpt_dir: str) -> tuple[int, str | None]:
    best, path = 0, None
    for p in glob.glob(os.path.join(ckpt_dir, "step-*.pt")):
        n = int(os.path.basename(p)[5:-3])
        if n > best:
            best, path = n, p
    return best, path


class FaultInjector:
    def __init__(self, spec: str | None, rank: int, ckpt_dir: str) -> None:
        self.kind = None
        if not spec:
            return
        parts = spec.split(":")
        kind, step = parts[0], parts[2]
        fault_rank = rank if parts[1] == "*" else int(parts[1])
        if fault_rank != rank:
            return
        self.kind = kind
        self.relative = step.startswith("+")
        self.step = int(step.lstrip("+"))
        self.always = len(parts) > 3 and parts[3] == "always"
        self.marker = os.path.join(ckpt_dir, f".fault-{kind}-{fault_rank}-{step}")

    def maybe_fire(self, step: int, start_step: int) -> None:
        if self.kind is None:
            return
        target = start_step + self.step if self.relative else self.step
        if step != target:
            return
        if not self.always:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return
        print(f"[toy] injecting {self.kind} at step {step} (pid {os.getpid()})", flush=True)
        if self.kind == "exception":
            raise RuntimeError(f"injected exception at step {step}")
        if self.kind == "permanent":
            raise PermanentError(f"injected permanent error at step {step}")
        if self.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "exit":
            os._exit(1)
        if self.kind == "stall":
            while True:  # no step, no report: only the in-process hang deadline ends it
                time.sleep(0.05)
        if self.kind in ("hang", "wedge"):
            # Block inside a system call (a read that never delivers): NVRx's abort reaches it
            # through a signal (nvrx_patches.apply_interrupting_abort), or NVRx's heartbeat timeout;
            # wedged, with every signal masked, only the heartbeat (or hard) timeout.
            if self.kind == "wedge":
                signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            r, _w = os.pipe()
            os.read(r, 1)


def main() -> None:
    env = RankEnv.from_env()
    reporter = RankReporter.from_env()
    os.makedirs(env.checkpoint_dir, exist_ok=True)
    total_steps = int(os.environ.get("TOY_STEPS", "0")) or None
    step_seconds = float(os.environ.get("TOY_STEP_SECONDS", "0.05"))
    events_path = os.environ.get("TOY_EVENTS")
    events = open(events_path, "a", buffering=1) if events_path else None  # noqa: SIM115
    # The launcher (a rank forked by rtj_trainer.rank_forkserver is told it: its parent is the server).
    launcher_pid = int(os.environ.get(ENV_LAUNCHER_PID) or os.getppid())
    injector = FaultInjector(os.environ.get("RTJ_FAULT_INJECT"), env.rank, env.checkpoint_dir)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)

    def train(*, call_wrapper, restart_count: int) -> None:
        rank = dist.get_rank()
        start, path = _latest_checkpoint(env.checkpoint_dir)
        if path:
            model.load_state_dict(torch.load(path)["model"])
            reporter.checkpoint_committed(start)  # named in the heartbeat, as CheckpointManager does
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        reporter.state(PodState.TRAINING)
        step = start
        while total_steps is None or step < total_steps:
            step += 1
            injector.maybe_fire(step, start)
            opt.zero_grad()
            ddp(torch.randn(4, 8)).sum().backward()
            opt.step()
            time.sleep(step_seconds)
            reporter.step(step)
            if events:
                record = {
                    "t": time.time(),
                    "rank": rank,
                    "step": step,
                    "pid": os.getpid(),
                    "ppid": launcher_pid,
                    "ipr": restart_count,
                    "ijr": env.restart_count,
                }
                if step == start + 1:  # what the collector walks (and what it leaves out) in this entry
                    record["gc_walked"], record["gc_frozen"] = len(gc.get_objects()), gc.get_freeze_count()
                events.write(json.dumps(record) + "\n")
            if step % env.checkpoint_interval_steps == 0:
                reporter.state(PodState.CHECKPOINTING)
                with reporter.section(Section.CHECKPOINT):  # its own hang budget, not the step's
                    if rank == 0:
                        tmp = os.path.join(env.checkpoint_dir, f".step-{step}.pt.tmp")
                        torch.save({"model": model.state_dict(), "step": step}, tmp)
                        os.replace(tmp, os.path.join(env.checkpoint_dir, f"step-{step}.pt"))
                    dist.barrier()
                reporter.checkpoint_committed(step)
                reporter.state(PodState.TRAINING)
        reporter.step(step)

    run_with_inprocess_restart(train, env, reporter)
    reporter.finished()


if __name__ == "__main__":
    main()
