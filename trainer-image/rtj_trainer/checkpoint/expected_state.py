"""The tensors a training state will hold once its optimizer has state, known before its first step.

torch.optim makes an optimizer's state lazily, in its first step, and torch's `get_state_dict`
(`state_tree.state_of`) gives an optimizer with none its state by running a step with zero gradients
on it: AdamW's first real step then counts as its second (another bias correction). So the snapshot
buffers' layout is never taken that way: `state_specs` gives the state's tensors as meta tensors
(shape and dtype, no data) where the optimizer has none yet, from the optimizer's own step run once
on a shadow of it, over meta tensors shaped like its parameters' local shards, with meta gradients.
Nothing of the real optimizer is touched.

Only optimizers of torch.optim, and only where their step runs on meta tensors (Adam, AdamW,
SGD, RMSprop, NAdam... do; Adafactor reads a value out of a tensor and does not): anything else
gives None.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .state_tree import flatten, local_shard, state_of

log = logging.getLogger(__name__)

#: torch.optim's switches between implementations of the same step (the shadow's step is the plain one).
IMPLEMENTATION_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def state_specs(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor] | None:
    """Meta tensors shaped and typed like those `flatten(state_of(model, optimizer))` gives once
    the optimizer has state (their order aside); None where the optimizer has none yet and its state
    cannot be foreseen. Never gives the optimizer state."""
    if optimizer is None or optimizer.state:
        tensors: list[torch.Tensor] = []
        flatten(state_of(model, optimizer), tensors)
        return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
    optim_tensors = _expected_optimizer_tensors(optimizer)
    if optim_tensors is None:
        return None
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    tensors = []
    flatten(get_model_state_dict(model), tensors)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    flatten(groups, tensors)  # a group's tensor hyperparameters (a tensor `lr`) are saved too
    return [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors] + optim_tensors


def _expected_optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor] | None:
    """The state tensors `optimizer`'s first step will make, from its step run on a shadow over meta
    tensors; None where that cannot be done."""
    cls = type(optimizer)
    if not cls.__module__.startswith("torch.optim"):
        return None
    shadows: list[torch.Tensor] = []
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        params = []
        for p in group["params"]:
            local = local_shard(p)
            shadow = torch.empty(local.shape, dtype=local.dtype, device="meta", requires_grad=p.requires_grad)
            if p.requires_grad:  # torch's step makes state only for a parameter with a gradient
                shadow.grad = torch.empty_like(shadow)
            params.append(shadow)
            shadows.append(shadow)
        hyper = {k: v for k, v in group.items() if k != "params"}
        # The plain implementation: a fused or foreach kernel may not run on meta tensors, and the
        # state's tensors are the same (a capturable or fused step count is on the device, 0-dim).
        hyper.update({k: False for k in IMPLEMENTATION_FLAGS if k in hyper})
        groups.append({**hyper, "params": params})
    try:
        # Not the class's constructor: its arguments are not all in `defaults` (AdamW's is not
        # Adam's). The base constructor fills each group from `defaults` as the real one was.
        shadow_optimizer = cls.__new__(cls)
        torch.optim.Optimizer.__init__(shadow_optimizer, groups, dict(optimizer.defaults))
        step = getattr(cls.step, "__wrapped__", None)  # not through the step hooks: no one's business
        with torch.no_grad():
            (step or cls.step)(shadow_optimizer)
    except Exception as e:  # any failure means: not foreseeable this way
        log.debug("the state of a %s cannot be foreseen: %r", cls.__name__, e)
        return None
    out: list[torch.Tensor] = []
    for shadow in shadows:
        for value in shadow_optimizer.state.get(shadow, {}).values():
            if isinstance(value, torch.Tensor):
                out.append(torch.empty(value.shape, dtype=value.dtype, device="meta"))
    return out
