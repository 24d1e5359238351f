"""Training state kept in memory across NVRx in-process restarts: no checkpoint read, no step lost.

On an in-process restart the ranks stay alive and so do their model and optimizer shards; only the
process group is new. The re-entered training function builds a fresh FSDP2 model on the new
group and adopts the kept shards (`KeptState.adopt`), as bench/inprocess_recovery.py measured
(1.0-1.7 s to the first step on 2xH200). It reloads from a snapshot only when the kept state is
known bad on some rank: missing, non-finite, or at another step than the other ranks'
(`agreed_step` is one tiny all-reduce). A lost rank never gets here: the in-process wrapper needs
the full world, else ft_launcher restarts the workers and the state comes from a snapshot.

The step counter and the optimizer step move together (`KeptState.advance` inside the wrapper's
atomic section), so an asynchronous abort never leaves weights of step s+1 labelled s.

    kept = KeptState()                     # once per process, outside the restart loop
    def train(*, call_wrapper, restart_count):
        model, optim = build(...)
        step = agreed_step(kept, group)
        if step is not None:
            kept.adopt(model, optim)       # the shards of the previous iteration
        else:
            step = load_from_snapshot(model, optim)
        kept.hold(model, optim, step)
        for ...:
            ...; kept.advance(optim, step + 1, call_wrapper)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _params(optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in optim.param_groups for p in g["params"]]


@dataclass
class KeptState:
    model: torch.nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    #: Optimizer steps applied to `model`/`optimizer`; None before the first `hold`.
    step: int | None = None

    def hold(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
        """Keep these (now complete) model and optimizer, at `step`."""
        self.model, self.optimizer, self.step = model, optimizer, step

    def advance(self, optimizer: torch.optim.Optimizer, step: int, call_wrapper: Any = None) -> None:
        """`optimizer.step()` and the kept step counter, together: the wrapper's abort waits."""
        section = call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext()
        with section:
            optimizer.step()
            self.step = step

    def finite(self) -> bool:
        """Every kept parameter and optimizer-state tensor is free of NaN and Inf."""
        if self.model is None or self.optimizer is None:
            return False
        tensors = [_local(p) for p in self.model.parameters()]
        for state in self.optimizer.state.values():
            tensors += [_local(v) for v in state.values() if isinstance(v, torch.Tensor)]
        with torch.no_grad():
            return all(bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point())

    def adopt(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Copy the kept shards into a model/optimizer built the same way on the new process group.

        The optimizer holds the sharded parameters (the module may hold unsharded ones if the fault
        hit inside forward/backward); its state tensors become DTensors on the new mesh.
        """
        assert self.model is not None and self.optimizer is not None, "nothing kept"
        old_optim = self.optimizer
        olds, news = _params(old_optim), _params(optimizer)
        if len(olds) != len(news):
            raise ValueError(f"kept optimizer has {len(olds)} parameters, the new one {len(news)}")
        with torch.no_grad():
            for p_new, p_old in zip(news, olds, strict=True):
                _local(p_new).copy_(_local(p_old))
                if p_old in old_optim.state:
                    optimizer.state[p_new] = {k: _rewrap(v, p_new) for k, v in old_optim.state[p_old].items()}
        for g_new, g_old in zip(optimizer.param_groups, old_optim.param_groups, strict=True):
            g_new.update({k: v for k, v in g_old.items() if k != "params"})

    def drop(self) -> None:
        self.model, self.optimizer, self.step = None, None, None


def _rewrap(value: Any, like: Any) -> Any:
    """An optimizer-state value placed on `like`'s (new) device mesh when it is a DTensor."""
    if not hasattr(value, "to_local") or not hasattr(like, "device_mesh"):
        return value
    return type(like).from_local(
        value.to_local(), like.device_mesh, like.placements, shape=value.shape, stride=value.stride()
    )


def agreed_step(kept: KeptState, group: Any = None) -> int | None:
    """The kept step when every rank holds usable state at that same step; else None (reload).

    One all-reduce on `group` (a CPU/gloo group): each rank offers its step, or -1 when its state
    is missing or not finite; the state is reused only when min == max >= 0.
    """
    mine = kept.step if kept.step is not None and kept.finite() else -1
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return mine if mine >= 0 else None
    t = torch.tensor([mine, -mine], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    low, high = int(t[0]), -int(t[1])
    return low if low == high and low >= 0 else None
