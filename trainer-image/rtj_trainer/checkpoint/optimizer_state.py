"""A fresh optimizer's state, made from a saved snapshot's layout instead of by a step.

torch's `get_state_dict`/`set_state_dict` give an optimizer that has no state yet (a restarted rank's
new one) its state by running a whole optimizer step with zero gradients over every parameter, and
only then load into it: 0.82 s of a 1.14 B-parameter rank's 1.2 s load on an H100 (FSDP2, AdamW),
0.27 s for 16 M parameters on the 2-core machine against 0.009 s once the state exists. `prefill`
makes the same tensors directly, zeros of the saved shapes and dtypes, placed as torch.optim's own
lazy initialisation places them: a tensor shaped like its parameter like the parameter (a DTensor
with its mesh and placements), the scalar `step` on the CPU unless the parameter's group is
`capturable` or `fused` (then on the parameter's device). The load then copies the snapshot into
them as before. Anything else (an optimizer not of torch.optim, a name that is not one of the
model's parameters, a parameter of no group, a state tensor of another shape, state already there)
leaves the optimizer untouched and the caller on torch's path.

Made that way, the state is cold: the first real step then runs the optimizer's kernels (and, for
FSDP2's DTensors, their sharding propagation) for the first time in the process. On an H100 the load
fell from 1.22 s to 0.33 s but the first step after it rose from 0.58-0.79 s to 1.40-1.68 s (one
SIGKILL restart each in the smoke and the goodput window); on the 2-core machine (FSDP2, 20 layers,
one gloo rank) the first optimizer step took 0.08-0.11 s after `prefill`, 0.04 s after torch's path.
So where the snapshot is still on its way to the GPU (a prefetch), the resume runs torch's own
zero-gradient step first (`warm`), while it waits: the state is made and the kernels warmed in time
that is otherwise spent waiting; `prefill` serves a load with nothing to wait for.
"""

from __future__ import annotations

from typing import Any

import torch

from ..checkpoint_format import ref_index


def prefill(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: Any, loaded: list[torch.Tensor]
) -> bool:
    """Give `optimizer` (with no state yet) zero state tensors laid out like `saved`, the saved
    optimizer skeleton (`get_state_dict`'s, parameters by their names); True when it did."""
    if not type(optimizer).__module__.startswith("torch.optim"):
        return False  # whose placement we know: torch.optim's own optimizers
    if optimizer.state or not isinstance(saved, dict) or not isinstance(saved.get("state"), dict):
        return False
    params = dict(model.named_parameters())
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    made: dict[torch.Tensor, dict[str, Any]] = {}
    for name, entry in saved["state"].items():
        param = params.get(name)
        if param is None or id(param) not in group_of or not isinstance(entry, dict):
            return False
        group = group_of[id(param)]
        on_device = bool(group.get("capturable") or group.get("fused"))
        local_shape = tuple((param.to_local() if hasattr(param, "to_local") else param).shape)
        state: dict[str, Any] = {}
        for key, value in entry.items():
            index = ref_index(value)
            if index is None:
                state[key] = value  # a plain value: the load sets it
                continue
            like = loaded[index]
            if like.dim() > 0 and tuple(like.shape) == local_shape:
                state[key] = torch.zeros_like(param, dtype=like.dtype, requires_grad=False)
            elif like.dim() == 0 and key == "step":
                device = param.device if on_device else torch.device("cpu")
                state[key] = torch.zeros((), dtype=like.dtype, device=device)
            else:  # e.g. Adafactor's row and column factors: left to torch
                return False
        made[param] = state
    for tensor, tensor_state in made.items():
        optimizer.state[tensor] = tensor_state
    return True


def warm(optimizer: torch.optim.Optimizer) -> bool:
    """Give `optimizer` (with no state yet) its state the way torch's `set_state_dict` does: one step
    with zero gradients and a learning rate of 0, which leaves the parameters as they were (the load
    then overwrites the state). True when it did: a torch.optim optimizer with no state and
    parameters with no gradients; torch's helper present (`_init_optim_state`, private: the test
    `tests/trainer_ckpt/test_optimizer_prefill.py` fails when torch moves it)."""
    if not type(optimizer).__module__.startswith("torch.optim") or optimizer.state:
        return False
    if any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
        return False  # torch's helper would refuse (it is no fresh optimizer)
    try:
        from torch.distributed.checkpoint.state_dict import _init_optim_state
    except ImportError:
        return False
    _init_optim_state(optimizer)
    return bool(optimizer.state)
