"""torchtitan (0.3.x) under the operator: our checkpointer in torchtitan's own checkpointer slot.

torchtitan's Trainer builds its checkpointer from `Trainer.Config.checkpoint` (a
`BaseCheckpointManager.Config`) and calls `load()` before the loop, `save(step, last_step)` after
every step and `close()` at the end. `RtjCheckpointer` is such a manager, so the Trainer, its loop
and its config stay torchtitan's (no fork):

    from rtj_trainer.integrations.titan import RtjCheckpointer
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    config = llama3_debugmodel()
    config.checkpoint = RtjCheckpointer.Config(enable=True)
    config.build().train()

- `load`: the newest step every rank can load (the pod's memory tier, else persisted; our
  CheckpointManager): model, optimizer, and in the checkpoint's extra data torchtitan's train
  state (step, tokens seen), LR schedulers and data loader position.
- `save`: an asynchronous checkpoint and/or memory snapshot when due (RankEnv's intervals, never
  waiting on storage), the step report (the pod heartbeat's step; NVRx's rank heartbeat: hang
  detection) and the graceful stop on the pod's SIGTERM (`emergency_save`, exit TERMINATED).
- `close`: the last save drains; the rank reports Finished.

One model part (no pipeline parallelism): our checkpoint holds one model and one optimizer. An
exception or a lost rank restarts the workers in-job (ft_launcher); no in-process restart (the
Trainer owns its process group). Checkpoints are ours; `dcp_export.export_dcp` writes one as DCP.
Not run on CPU: torchtitan 0.3.0 picks "cuda" when no accelerator is found, and its debug model
reads the tokenizer and `c4_test` data from its repository's tests/assets.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from rtj.contract import ExitCode, PodState
from torchtitan.components.checkpointer.base import BaseCheckpointManager

from rtj_trainer.checkpoint import CheckpointConfig, CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

from .session import ENV_TRAIN_LOG_DIR, StepLog


def _plain(value: Any) -> bool:
    """Whether `value` is data our checkpoint's extra can hold (no tensors, no objects)."""
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    return False


class RtjCheckpointer(BaseCheckpointManager):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseCheckpointManager.Config):
        """torchtitan's checkpoint policies; the intervals, folder and tiers are the pod's (RankEnv)."""

    def __init__(
        self,
        config: Config,
        *,
        dataloader: Any,
        model_parts: list[Any],
        optimizers: Any,
        lr_schedulers: Any,
        states: dict[str, Any],
        sd_adapter: Any = None,
        base_folder: str = "",
    ) -> None:
        self.enable = config.enable
        self.save_future = None
        if not self.enable:
            return
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

    def _extra(self) -> dict[str, Any]:
        extra = {"train_state": {k: s.state_dict() for k, s in self.states.items()}}
        extra["lr_schedulers"] = self.lr_schedulers.state_dict()
        if self.dataloader is not None:
            extra["dataloader"] = self.dataloader.state_dict()
        return {k: v for k, v in extra.items() if _plain(v)}  # what is not plain data restarts

    def _load(self, step: int = -1) -> bool:
        self.reporter.state(PodState.TRAINING)
        resumed = self.ckpt.load_latest(self.model, self.optimizer)
        if resumed is None:
            self.log.write(
                event="resume", step=0, source="init", restart=self.env.restart_count, t=time.time()
            )
            return False
        extra = resumed.extra
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

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        if not self._prepared:
            self.ckpt.prepare(self.model, self.optimizer)
            self._prepared = True
        outcome = self.ckpt.maybe_save(curr_step, self.model, self.optimizer, extra=self._extra())
        self.reporter.step(curr_step)
        self.log.write(step=curr_step, loss=None, save=outcome, restart=self.env.restart_count, t=time.time())
        if self.stop.agreed(self.group):
            self.stop.saving()
            self.reporter.state(PodState.CHECKPOINTING)
            saved = self.ckpt.emergency_save(curr_step, self.model, self.optimizer, extra=self._extra())
            with contextlib.suppress(Exception):
                dist.barrier(group=self.group)
            self.log.write(event="stopped", step=curr_step, persisted=saved, t=time.time())
            os._exit(ExitCode.TERMINATED)
        return outcome == "saved"

    def _maybe_wait_for_staging(self) -> None:
        """Nothing: our snapshot's copy is fenced before the next optimizer step by the manager."""

    def _wait_for_saving(self) -> None:
        """Nothing: saves never leave a future for the Trainer to await."""

    def _close(self) -> None:
        self.ckpt.close(timeout=self.ckpt.commit_timeout_s)
        self.reporter.finished()
