"""torchtitan (0.2.x) under the operator: our checkpointer in torchtitan's Trainer's checkpointer slot.

torchtitan 0.2.2's Trainer builds its `CheckpointManager` itself, in `Trainer.__init__` (no config
names another manager class: its class body lists the checkpointer as "non-swappable"), and then
reaches it only through its public attribute `Trainer.checkpointer`: `load(step=...)` before the
loop, `maybe_wait_for_staging()` before every optimizer step, `save(step, last_step=...)` after
every step and `close()` in `Trainer.close`. `RtjTrainer` subclasses torchtitan's Trainer for one
thing, swapping that attribute: after torchtitan's own `__init__` (which builds its manager with
checkpointing off, so that it holds no thread, process group or folder) it puts an `RtjCheckpointer`
there, built from the same components. Its `__init__`, train loop, `train_step` and `close` stay
torchtitan's, and so does its config (a `JobConfig` read by torchtitan's `ConfigManager` from its
TOML files and command line). A subclass rather than a patched module global
(`torchtitan.train.CheckpointManager`): it leaves every other Trainer in the process alone, and
torchtitan's own entry point takes a Trainer class (`main(trainer_class)`, as its Flux trainer does):

    # train.py, run as `python train.py --job.config_file debug_model.toml ...` (torchtitan's flags)
    from torchtitan.train import main
    from rtj_trainer.integrations.titan import RtjTrainer
    main(RtjTrainer)

- `load`: the newest step every rank can load (the pod's memory tier, else persisted; our
  CheckpointManager): model, optimizer, and in the checkpoint's extra data torchtitan's train
  state (step, tokens seen), LR schedulers and data loader position.
- `save`: an asynchronous checkpoint and/or memory snapshot when due (RankEnv's intervals, never
  waiting on storage), the step report (the pod heartbeat's step; NVRx's rank heartbeat: hang
  detection) and the graceful stop on the pod's SIGTERM (`emergency_save`, exit TERMINATED).
- `close`: the last save drains; the rank reports Finished, unless the Trainer is being closed on
  an exception (torchtitan's `main` closes it in its `except` too): that rank is failing, and its
  pod's heartbeat must say how it ended.

torchtitan's `[checkpoint]` section is not read: when to save, where, and which tiers are the pod's
(RankEnv), and `load` always takes the newest step every rank can load (`checkpoint.load_step` and
`checkpoint.enable` have no effect). Checkpoints are ours; torchtitan 0.2's models keep their
parameters' own names in their state dicts, so `dcp_export.export_dcp` writes one as DCP as it is.

The checkpoint's extra data is plain data (JSON-like): bytes in it, such as the pickled state of
torchtitan's data loader, are kept base64-encoded and decoded on load; anything else that is not
plain data is left out (it starts afresh after a resume).

One model part (no pipeline parallelism): our checkpoint holds one model and one optimizer. An
exception or a lost rank restarts the workers in-job (ft_launcher); no in-process restart (the
Trainer owns its process group). torchtitan 0.2.2 does not run on CPU by itself (it picks "cuda"
when no accelerator is found), and the tokenizer and `c4_test` data of its Llama 3 debug model (its
default config) live in its repository, not in its wheel: bench/titan_smoke.py makes the assets,
and runs the Trainer with this checkpointer on the product path (on CPU with `--cpu`, a self-test).
"""

from __future__ import annotations

import base64
import dataclasses
import os
import sys
import time
from typing import Any

import torch.distributed as dist
from rtj.contract import PodState
from torchtitan.train import Trainer

from rtj_trainer.checkpoint import CheckpointConfig, CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

from .session import ENV_TRAIN_LOG_DIR, StepLog

#: Marks bytes kept in the checkpoint's extra data as base64 text.
_BYTES_KEY = "__rtj_bytes_b64__"


def _encode_bytes(value: Any) -> Any:
    """`value` with every bytes object in it replaced by {_BYTES_KEY: base64 text}."""
    if isinstance(value, bytes):
        return {_BYTES_KEY: base64.b64encode(value).decode("ascii")}
    if isinstance(value, dict):
        return {k: _encode_bytes(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode_bytes(v) for v in value]
    return value


def _decode_bytes(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_BYTES_KEY} and isinstance(value[_BYTES_KEY], str):
            return base64.b64decode(value[_BYTES_KEY])
        return {k: _decode_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_bytes(v) for v in value]
    return value


def _plain(value: Any) -> bool:
    """Whether `value` is data our checkpoint's extra can hold (no tensors, no objects)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return False


class RtjCheckpointer:
    """What torchtitan's Trainer asks of its `checkpointer` (`load`, `maybe_wait_for_staging`,
    `save`, `close`), on our CheckpointManager; built by `RtjTrainer` from the Trainer's own
    components, with the keyword arguments torchtitan's CheckpointManager takes for them."""

    def __init__(
        self,
        *,
        dataloader: Any,
        model_parts: list[Any],
        optimizers: Any,
        lr_schedulers: Any,
        states: dict[str, Any],
    ) -> None:
        if len(model_parts) != 1 or len(optimizers.optimizers) != 1:
            raise ValueError(
                "RtjCheckpointer holds one model part and one optimizer (no pipeline parallelism)"
            )
        self.model, self.optimizer = model_parts[0], optimizers.optimizers[0]
        self.dataloader, self.lr_schedulers, self.states = dataloader, lr_schedulers, states
        env = self.env = RankEnv.from_env()
        self.reporter = RankReporter.from_env()
        self.group: Any = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        self.ckpt = CheckpointManager.from_config(
            CheckpointConfig.from_rank_env(env), group=self.group, reporter=self.reporter
        )
        self.stop = GracefulStop.install(status_dir=env.status_dir)
        self.log = StepLog(os.environ.get(ENV_TRAIN_LOG_DIR), env.rank)
        self._prepared = False
        self._closed = False

    def _extra(self) -> dict[str, Any]:
        extra = {"train_state": {k: s.state_dict() for k, s in self.states.items()}}
        extra["lr_schedulers"] = self.lr_schedulers.state_dict()
        if self.dataloader is not None:
            extra["dataloader"] = self.dataloader.state_dict()
        encoded = {k: _encode_bytes(v) for k, v in extra.items()}
        return {k: v for k, v in encoded.items() if _plain(v)}  # what is not plain data restarts

    def load(self, step: int = -1) -> bool:
        """Resume from the newest step every rank can load (`step`, torchtitan's
        `checkpoint.load_step`, is not read); False when there is none (a fresh start)."""
        self.reporter.state(PodState.TRAINING)
        resumed = self.ckpt.load_latest(self.model, self.optimizer)
        if resumed is None:
            self.log.write(
                event="resume", step=0, source="init", restart=self.env.restart_count, t=time.time()
            )
            return False
        extra = _decode_bytes(resumed.extra)
        for key, state in self.states.items():
            if key in extra.get("train_state", {}):
                state.load_state_dict(extra["train_state"][key])
        if "lr_schedulers" in extra:
            self.lr_schedulers.load_state_dict(extra["lr_schedulers"])
        if "dataloader" in extra and self.dataloader is not None:
            self.dataloader.load_state_dict(extra["dataloader"])
        self.log.write(
            event="resume",
            step=resumed.step,
            source=resumed.source,
            restart=self.env.restart_count,
            t=time.time(),
        )
        return True

    def maybe_wait_for_staging(self) -> None:
        """Nothing: our snapshot's copy is fenced before the next optimizer step by the manager."""

    def save(self, curr_step: int, last_step: bool = False) -> None:
        if not self._prepared:
            self.ckpt.prepare(self.model, self.optimizer)
            self.reporter.ceiling_while(lambda: self.ckpt.preparing)
            self._prepared = True
        outcome = self.ckpt.maybe_save(curr_step, self.model, self.optimizer, extra=self._extra())
        self.reporter.step(curr_step)
        self.log.write(step=curr_step, loss=None, save=outcome, restart=self.env.restart_count, t=time.time())
        if self.stop.agreed(self.group):
            self.stop.save_and_exit(
                self.ckpt, curr_step, self.model, self.optimizer, extra=self._extra(), group=self.group,
                reporter=self.reporter, log=self.log.write,
            )  # fmt: skip

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        failing = sys.exc_info()[1] is not None  # closed from an `except` or `finally` on the way out
        self.ckpt.close(timeout=self.ckpt.commit_timeout_s)
        if not failing:
            self.reporter.finished()


class RtjTrainer(Trainer):
    """torchtitan's Trainer with an `RtjCheckpointer` (`checkpointer_cls`) in its `checkpointer`."""

    #: What `__init__` puts in `self.checkpointer` (a subclass of RtjCheckpointer, say).
    checkpointer_cls: type[RtjCheckpointer] = RtjCheckpointer

    def __init__(self, job_config: Any) -> None:
        # torchtitan's own manager is built with checkpointing off (it is replaced below); the
        # config the Trainer keeps is the caller's, unchanged.
        checkpoint = job_config.checkpoint
        job_config.checkpoint = dataclasses.replace(checkpoint, enable=False)
        try:
            super().__init__(job_config)
        finally:
            job_config.checkpoint = checkpoint
        self.checkpointer = self.checkpointer_cls(
            dataloader=self.dataloader,
            model_parts=self.model_parts,
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self},
        )


def main() -> None:
    """`python -m rtj_trainer.integrations.titan <torchtitan's flags>`: torchtitan's own entry point
    (its train.py's `main`) with RtjTrainer, for a job's command (examples/torchtitan.yaml)."""
    from torchtitan.train import main as torchtitan_main

    torchtitan_main(RtjTrainer)


if __name__ == "__main__":
    main()
