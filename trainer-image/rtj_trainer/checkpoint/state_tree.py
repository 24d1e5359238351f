"""A training state as a skeleton plus a flat list of tensors, and back.

The skeleton keeps the nesting and the plain values; each tensor (the local shard of a DTensor) is
replaced by a reference into the list (`checkpoint_format.tensor_ref`). Loading places every saved
tensor like the live one at the same path, so FSDP2 meshes and placements stay the live ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..checkpoint_format import CheckpointError, ref_index, tensor_ref
from .optimizer_state import prefill


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard; a plain tensor as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def flatten(obj: Any, out: list[torch.Tensor], path: str = "") -> Any:
    """The skeleton of a state tree, appending its tensors (local shards of DTensors) to `out`."""
    if isinstance(obj, torch.Tensor):
        out.append(local_shard(obj).detach())
        return tensor_ref(len(out) - 1)
    if isinstance(obj, dict):
        return {k: flatten(v, out, f"{path}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        return [flatten(v, out, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(flatten(v, out, f"{path}[{i}]") for i, v in enumerate(obj))
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot checkpoint {type(obj).__name__} at {path or '<root>'}")


def unflatten(skel: Any, current: Any, loaded: list[torch.Tensor], mapped: bool = False) -> Any:
    """The saved tree with every tensor placed like the `current` one at the same path.

    A DTensor in `current` receives the saved local shard in place (so mesh and placements are the
    live ones); a plain tensor is copied into or moved to the current tensor's device. `mapped`:
    `loaded` are views of a snapshot file (`shard_io.map_shard`), so a tensor with no current one to
    be copied into is copied out of the file (the file is rewritten in place by a later snapshot).
    """
    idx = ref_index(skel)
    if idx is not None:
        saved = loaded[idx]
        if isinstance(current, torch.Tensor):
            local = local_shard(current)
            if tuple(local.shape) != tuple(saved.shape) or local.dtype != saved.dtype:
                raise CheckpointError(
                    f"saved tensor {tuple(saved.shape)}/{saved.dtype} does not fit the model's "
                    f"{tuple(local.shape)}/{local.dtype}"
                )
            local.copy_(saved)
            return current
        return saved.clone() if mapped else saved
    if isinstance(skel, dict):
        by_key: dict[Any, Any] = current if isinstance(current, dict) else {}
        return {k: unflatten(v, by_key.get(k), loaded, mapped) for k, v in skel.items()}
    if isinstance(skel, list | tuple):
        in_order: Sequence[Any] = (
            current if isinstance(current, list | tuple) and len(current) == len(skel) else [None] * len(skel)
        )
        items = [unflatten(v, c, loaded, mapped) for v, c in zip(skel, in_order, strict=True)]
        return items if isinstance(skel, list) else tuple(items)
    return skel


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model), "optim": None}
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd}


def load_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    skeleton: Any,
    loaded: list[torch.Tensor],
    *,
    mapped: bool,
) -> dict[str, Any]:
    """Put a saved (skeleton, tensors) into the live model and optimizer; the saved tree. A fresh
    optimizer's state is made from the snapshot's layout (`optimizer_state.prefill`); should the
    load not fit it, the state is dropped and torch makes it (a step with zero gradients)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    prefilled = (
        optimizer is not None
        and isinstance(skeleton, dict)
        and prefill(model, optimizer, skeleton.get("optim"), loaded)
    )
    while True:
        try:
            current = state_of(model, optimizer)
            with torch.no_grad():
                state = unflatten(skeleton, current, loaded, mapped=mapped)
            if optimizer is None:
                set_model_state_dict(model, state["model"])
            else:
                set_state_dict(
                    model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
                )
            return state
        except (CheckpointError, RuntimeError, KeyError, ValueError):
            if not prefilled:
                raise
            assert optimizer is not None
            optimizer.state.clear()  # torch's way, from scratch
            prefilled = False


def as_bytes(t: torch.Tensor) -> memoryview:
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def dtype_named(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in checkpoint")
    return dt
