"""A fresh optimizer's state is foreseen without giving it one (`expected_state.state_specs`, on a
shadow over meta tensors): the same tensors as torch's own first step makes, the real optimizer
untouched (no state, no step hooks, the parameters as they were); so `prepare` before the first
step leaves the optimizer's first real step its first. FSDP2 on one gloo rank in this process (the
example's model)."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint.expected_state import state_specs
from rtj_trainer.checkpoint.snapshot_ring import layout
from rtj_trainer.checkpoint.state_tree import flatten, state_of
from rtj_trainer.examples.fsdp_train import ModelConfig, build
from torch.optim.optimizer import register_optimizer_step_pre_hook

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

CFG = ModelConfig(vocab=512, dim=64, layers=4, heads=4, seq=32)
OPTIMIZERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "Adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "AdamW-fused": lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True),  # the HF Trainer's default
    "Adam-foreach": lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True),
    "AdamW-amsgrad-tensor-lr": lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3), amsgrad=True),
    "SGD-momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "SGD": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "RMSprop": lambda ps: torch.optim.RMSprop(ps, momentum=0.5),
    "NAdam": lambda ps: torch.optim.NAdam(ps),
}


def _fsdp(
    make: Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer],
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, _ = build(CFG, torch.device("cpu"), lr=1e-2, seed=0, bf16=False)
    model.head.weight.requires_grad_(False)  # a frozen parameter gets no state
    return model, make(list(model.parameters()))


def _step(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    x = torch.randint(0, CFG.vocab, (2, CFG.seq), generator=torch.Generator().manual_seed(7))
    model(x).float().pow(2).mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def _shapes(tensors: list[torch.Tensor]) -> Counter[tuple[tuple[int, ...], torch.dtype]]:
    return Counter((tuple(t.shape), t.dtype) for t in tensors)


def _params_hash(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        h.update(local.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_foreseen_state_is_the_first_steps_and_the_optimizer_is_left_untouched(
    one_gloo_rank: None, name: str
) -> None:
    model, optim = _fsdp(OPTIMIZERS[name])
    before = _params_hash(model)
    hooks: list[object] = []
    handle = register_optimizer_step_pre_hook(lambda *a: hooks.append(a))
    try:
        specs = state_specs(model, optim)
    finally:
        handle.remove()
    assert specs is not None and all(t.device.type == "meta" for t in specs)
    assert not optim.state and not hooks and _params_hash(model) == before
    _step(model, optim)
    real: list[torch.Tensor] = []
    flatten(state_of(model, optim), real)
    assert _shapes(specs) == _shapes(real)
    assert layout(specs)[1] == layout(real)[1]  # what a slot is sized by


def test_an_optimizer_whose_step_cannot_run_on_meta_tensors_is_not_foreseen(one_gloo_rank: None) -> None:
    model, optim = _fsdp(lambda ps: torch.optim.Adafactor(ps))  # reads a value out of a tensor
    assert state_specs(model, optim) is None and not optim.state


def _manager(tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(
        str(tmp_path / "persist"), rank=0, world_size=1, interval_steps=1000,
        local_root=str(tmp_path / "shm"), local_interval_steps=1, local_keep=2,
    )  # fmt: skip


def test_prepare_before_the_first_step_gives_the_optimizer_no_state(
    one_gloo_rank: None, tmp_path: Path
) -> None:
    """torch's `get_state_dict` would give a fresh optimizer its state by a step with zero
    gradients: AdamW's first real step would then count as its second (another bias correction)."""
    model, optim = _fsdp(OPTIMIZERS["Adam"])
    mgr = _manager(tmp_path)
    mgr.prepare(model, optim)
    assert mgr.wait(timeout=60)
    assert not optim.state
    _step(model, optim)
    assert {float(s["step"]) for s in optim.state.values()} == {1.0}
