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
- `close`: the last save drains; the rank reports Finished, unless the Trainer is being closed on
  an exception (torchtitan's `train.py` closes it in its `except` too): that rank is failing, and
  its pod's heartbeat must say how it ended.

Our checkpoints hold the model's parameters under their own names: torchtitan's fused modules
(FusedQKVLinear) rename their state-dict keys in hooks (`wqkv` -> the stock `wq`/`wk`/`wv`, for
interop with its HF adapter), which torch.distributed.checkpoint's get_state_dict cannot map back to
parameters; `parameter_keys(model)` sets torchtitan's state-dict hooks aside while the
CheckpointManager reads or loads the state (wrap `export_dcp` of a torchtitan model in it too).

The checkpoint's extra data is plain data (JSON-like): bytes in it, such as the pickled state of
torchtitan's data loader, are kept base64-encoded and decoded on load; anything else that is not
plain data is left out (it starts afresh after a resume).

One model part (no pipeline parallelism): our checkpoint holds one model and one optimizer. An
exception or a lost rank restarts the workers in-job (ft_launcher); no in-process restart (the
Trainer owns its process group). Checkpoints are ours; `dcp_export.export_dcp` writes one as DCP.
torchtitan 0.3.0 does not run on CPU by itself (it picks "cuda" when no accelerator is found, and
FlexAttention has no CPU backward), and its debug model reads the tokenizer and `c4_test` data from
its repository's tests/assets, which its wheel lacks: bench/titan_smoke.py makes those assets and
runs the Trainer with this checkpointer on the product path (on CPU with `--cpu`, a self-test).
"""

from __future__ import annotations

import base64
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
import torch.nn as nn
from rtj.contract import ExitCode, PodState
from torchtitan.components.checkpointer.base import BaseCheckpointManager

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


def _torchtitan_hook(hook: Any) -> bool:
    fn = getattr(hook, "hook", hook)  # torch wraps load_state_dict pre-hooks (_WrappedHook)
    return str(getattr(fn, "__module__", "") or "").startswith("torchtitan.")


@contextlib.contextmanager
def parameter_keys(model: nn.Module) -> Iterator[None]:
    """`model.state_dict()` keyed by parameter names: torchtitan's own state-dict hooks (save
    post-hooks and load pre-hooks that rename keys, e.g. FusedQKVLinear's wqkv <-> wq/wk/wv) are set
    aside meanwhile, in place and in order; torch's and FSDP's hooks stay."""
    saved: list[tuple[dict[Any, Any], dict[Any, Any]]] = []
    for module in model.modules():
        for table in (module._state_dict_hooks, module._load_state_dict_pre_hooks):
            if any(_torchtitan_hook(h) for h in table.values()):
                saved.append((table, dict(table)))
                kept = {k: h for k, h in table.items() if not _torchtitan_hook(h)}
                table.clear()
                table.update(kept)
    try:
        yield
    finally:
        for table, before in saved:
            table.clear()
            table.update(before)


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
        self._closed = False

    def _extra(self) -> dict[str, Any]:
        extra = {"train_state": {k: s.state_dict() for k, s in self.states.items()}}
        extra["lr_schedulers"] = self.lr_schedulers.state_dict()
        if self.dataloader is not None:
            extra["dataloader"] = self.dataloader.state_dict()
        encoded = {k: _encode_bytes(v) for k, v in extra.items()}
        return {k: v for k, v in encoded.items() if _plain(v)}  # what is not plain data restarts

    def _load(self, step: int = -1) -> bool:
        self.reporter.state(PodState.TRAINING)
        with parameter_keys(self.model):
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

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        with parameter_keys(self.model):
            if not self._prepared:
                self.ckpt.prepare(self.model, self.optimizer)
                self._prepared = True
            outcome = self.ckpt.maybe_save(curr_step, self.model, self.optimizer, extra=self._extra())
        self.reporter.step(curr_step)
        self.log.write(step=curr_step, loss=None, save=outcome, restart=self.env.restart_count, t=time.time())
        if self.stop.agreed(self.group):
            self.stop.saving()
            self.reporter.state(PodState.CHECKPOINTING)
            with parameter_keys(self.model):
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
        if self._closed:  # torchtitan closes the Trainer, and BaseCheckpointManager.__del__ again
            return
        self._closed = True
        failing = sys.exc_info()[1] is not None  # closed from an `except` or `finally` on the way out
        self.ckpt.close(timeout=self.ckpt.commit_timeout_s)
        if not failing:
            self.reporter.finished()
