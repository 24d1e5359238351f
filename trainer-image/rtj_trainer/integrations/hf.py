"""Hugging Face Transformers `Trainer` under the operator: one callback.

    from rtj_trainer.integrations.hf import ResilienceCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ResilienceCallback()])
    trainer.train()

Trainer initialises torch.distributed itself (from the torchrun variables ft_launcher sets), so
the callback adds what the Trainer lacks, through its own hooks:
- `on_train_begin`: resumes from the newest step every rank can load (the pod's memory tier, else
  the persisted checkpoint; `CheckpointManager.load_latest`): model, optimizer and, from the
  checkpoint's extra data, the LR scheduler; `state.global_step` is set to it, so the Trainer stops
  at `max_steps` as if it had run through. The data loader starts again at the epoch's start (the
  Trainer skips batches only on its own `resume_from_checkpoint`).
- `on_step_end`: after the first step, the snapshot buffers (`CheckpointManager.prepare`: the GPU
  staging buffer is sized against what training reserved by then); an asynchronous checkpoint
  and/or memory snapshot when due (never waits on storage), the step report (the pod heartbeat's
  step, NVRx's rank heartbeat: hang detection) and the graceful stop: after the pod's SIGTERM the
  ranks agree on a step, `emergency_save` keeps it (memory, peer replica, volume, as far as the
  pod's deadline allows) and the rank exits with ExitCode.TERMINATED (`GracefulStop.save_and_exit`).
- `on_train_end`: the last save drains; the rank reports Finished.

An exception or a lost rank restarts the workers in-job (ft_launcher), and they resume from the
memory tier. No in-process restart: the Trainer owns its process group. The Trainer's own
`save_strategy` saves may stay on (they are its; ours are the fast ones) or be turned off.
With env RTJ_TRAIN_LOG_DIR each rank writes the step log the local tools read steps lost from.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch.distributed as dist
from rtj.contract import PodState
from transformers import TrainerCallback

from rtj_trainer.checkpoint import CheckpointConfig, CheckpointManager
from rtj_trainer.graceful import GracefulStop
from rtj_trainer.report import RankReporter
from rtj_trainer.runtime_env import RankEnv

from .session import ENV_TRAIN_LOG_DIR, StepLog


def inner_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside Accelerate's AcceleratedOptimizer (hooks fire on the inner one)."""
    return getattr(optimizer, "optimizer", optimizer)


class ResilienceCallback(TrainerCallback):
    def __init__(self, env: RankEnv | None = None) -> None:
        self.env = env or RankEnv.from_env()
        self.reporter = RankReporter.from_env()
        self.ckpt: CheckpointManager | None = None
        self.stop: GracefulStop | None = None
        self.group: Any = None
        self.log = StepLog(os.environ.get(ENV_TRAIN_LOG_DIR), self.env.rank)
        self._loss: float | None = None
        self._scheduler: Any = None
        self._prepared = False

    def _manager(self) -> CheckpointManager:
        return CheckpointManager.from_config(CheckpointConfig.from_rank_env(self.env), reporter=self.reporter)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        model, optim = kw["model"], inner_optimizer(kw["optimizer"])
        self._scheduler = kw.get("lr_scheduler")
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and dist.get_backend() != "gloo":
            self.group = dist.new_group(backend="gloo")  # the runtime's agreements are CPU all-reduces
        self.ckpt = ckpt = self._manager()
        ckpt.set_group(self.group)
        self.stop = GracefulStop.install(status_dir=self.env.status_dir)
        self.reporter.state(PodState.TRAINING)
        resumed = self.ckpt.load_latest(model, optim)
        start, source = (resumed.step, resumed.source) if resumed is not None else (state.global_step, "init")
        if resumed is not None:
            sched = resumed.extra.get("scheduler")
            if sched is not None and self._scheduler is not None:
                self._scheduler.load_state_dict(sched)
            state.global_step = resumed.step
        self.log.write(
            event="resume", step=start, source=source, restart=self.env.restart_count, t=time.time()
        )
        self._prepared = False  # after the first step: `CheckpointManager.prepare`

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if logs and "loss" in logs:
            self._loss = float(logs["loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        assert self.ckpt is not None and self.stop is not None
        step = state.global_step
        model, optim = kw["model"], inner_optimizer(kw["optimizer"])
        if not self._prepared:
            ckpt = self.ckpt
            ckpt.prepare(model, optim)
            self.reporter.ceiling_while(lambda: ckpt.preparing)
            self._prepared = True
        extra = {"scheduler": self._scheduler.state_dict()} if self._scheduler is not None else {}
        outcome = self.ckpt.maybe_save(step, model, optim, extra=extra)
        self.reporter.step(step)
        self.log.write(
            step=step, loss=self._loss, save=outcome, restart=self.env.restart_count, t=time.time()
        )
        if self.stop.agreed(self.group):
            self.stop.save_and_exit(
                self.ckpt, step, model, optim, extra=extra, group=self.group, reporter=self.reporter,
                log=self.log.write,
            )  # fmt: skip

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.ckpt is not None:
            self.ckpt.close(timeout=self.ckpt.commit_timeout_s)
        self.reporter.finished()
