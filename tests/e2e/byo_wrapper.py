"""Runs a training script we did not write, unchanged, with what an e2e row adds from outside its code
(tests/e2e/test_byo_trainers.py):

    python byo_wrapper.py [OPTIONS] -- -m package.module ARGS...
    python byo_wrapper.py [OPTIONS] -- script.py ARGS...

- `--env NAME=VALUE`: set in the rank's environment before anything else runs: the test tools'
  variables (RTJ_TRAIN_LOG_DIR, the HF example's RTJ_FAULT_INJECT), which a job's `spec.env` may not
  name (RTJ_* are the runtime's);
- `--min-step-seconds S`: every optimizer step padded to S seconds (a global optimizer-step
  post-hook, after the runtime's own step report), so that faults land mid-run on any machine, as
  fsdp_train's `--min-step-time` does from inside;
- `--faults SPEC`: faults for a script that has no fault hook, `RTJ_FAULT_INJECT`'s items
  (rtj_trainer.examples.faults: once per job, marker files in the checkpoint dir), fired from a
  global optimizer-step pre-hook before the step they name (the optimizer's own count, Adam-family
  `state["step"]`, plus one): an exception comes out of the script's own `optimizer.step()`, a
  SIGKILL kills the rank there. Each is noted in the rank's step log (RTJ_TRAIN_LOG_DIR) first;
- `{pod}` in an argument is the pod's name (RTJ_POD_NAME), as `$(RTJ_POD_NAME)` would be on a
  kubelet (the node agent expands nothing), and the rank's step log directory is created, so that
  a script's own `--log-file` can write its lines there, next to the fault notes.

The test copies this file onto the job's checkpoint volume, where the pods find it on the node agent
and on kubelet nodes alike. The pod's rank server pre-imports what this file imports, not what the
script imports: each rank start imports the script's own modules.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
from typing import Any

from rtj.contract import ENV_POD_NAME
from rtj_trainer.examples.faults import FaultInjector, parse_faults
from rtj_trainer.integrations.autoreport import optimizer_state_step, zero_lr
from rtj_trainer.integrations.session import ENV_TRAIN_LOG_DIR, StepLog
from rtj_trainer.runtime_env import RankEnv
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this wrapper's options, the script's command: `-m module ...` or `script.py ...`)."""
    if "--" not in argv:
        raise SystemExit("byo_wrapper: the script's command follows `--`")
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def install_pacing(seconds: float) -> None:
    last = [time.monotonic()]

    def pad(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if zero_lr(optimizer):  # torch.distributed.checkpoint's state initialisation, no step
            return
        time.sleep(max(0.0, seconds - (time.monotonic() - last[0])))
        last[0] = time.monotonic()

    register_optimizer_step_post_hook(pad)


def install_faults(spec: str, env: RankEnv, log: StepLog) -> None:
    injector = FaultInjector(parse_faults(spec), env.rank, env.checkpoint_dir, log.write)
    started = [False]

    def before_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if zero_lr(optimizer):
            return
        own = optimizer_state_step(optimizer)
        step = (own[0] if own is not None else 0) + 1
        if not started[0]:  # the step this run resumed at ("+N" faults count from it)
            injector.start_step, started[0] = step - 1, True
        injector.before_step(step)

    register_optimizer_step_pre_hook(before_step)


def main(argv: list[str]) -> None:
    own, command = split_argv(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--min-step-seconds", type=float, default=0.0)
    p.add_argument("--faults", default="")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    args = p.parse_args(own)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"byo_wrapper: --env {item!r} is not NAME=VALUE")
        os.environ[name] = value
    env = RankEnv.from_env()
    log = StepLog(os.environ.get(ENV_TRAIN_LOG_DIR), env.rank)  # creates the log directory
    pod = os.environ.get(ENV_POD_NAME, "pod")
    command = [a.replace("{pod}", pod) for a in command]
    if args.min_step_seconds > 0:
        install_pacing(args.min_step_seconds)
    if args.faults:
        install_faults(args.faults, env, log)
    if command[:1] == ["-m"] and len(command) >= 2:
        sys.argv = [command[1], *command[2:]]
        runpy.run_module(command[1], run_name="__main__", alter_sys=True)
    elif command:
        sys.argv = command
        sys.path.insert(0, os.path.dirname(os.path.abspath(command[0])))
        runpy.run_path(command[0], run_name="__main__")
    else:
        raise SystemExit("byo_wrapper: no script to run after `--`")


if __name__ == "__main__":
    main(sys.argv[1:])
