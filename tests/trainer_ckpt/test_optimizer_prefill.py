"""A restarted rank's fresh optimizer gets its state from the snapshot's layout (`optimizer_state.
prefill`), not from torch's step with zero gradients: the same tensors (DTensors like their
parameters, Adam's `step` where torch.optim puts it), the same loaded values, the same training
after it; or, while the snapshot is still on its way, from torch's own step (`warm`), which leaves
the parameters as they were. FSDP2 on one gloo rank in this process (the example's model), real
tensors."""

from __future__ import annotations

import time

import pytest
import torch
from rtj_trainer.checkpoint.optimizer_state import prefill, warm
from rtj_trainer.checkpoint.state_tree import flatten, load_state, state_of, unflatten
from rtj_trainer.examples.fsdp_train import ModelConfig, build
from torch.distributed.checkpoint.state_dict import set_state_dict

pytestmark = pytest.mark.trainer

CFG = ModelConfig(vocab=512, dim=64, layers=4, heads=4, seq=32)


def _trained(seed: int = 0, steps: int = 2) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model, optim = build(CFG, torch.device("cpu"), lr=1e-2, seed=seed, bf16=False)
    for step in range(steps):
        _step(model, optim, step)
    return model, optim


def _step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, CFG.vocab, (2, CFG.seq), generator=g)
    model(x).float().pow(2).mean().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)


def _snapshot(model: torch.nn.Module, optim: torch.optim.Optimizer) -> tuple[dict, list[torch.Tensor]]:
    tensors: list[torch.Tensor] = []
    skeleton = flatten(state_of(model, optim), tensors)
    return skeleton, [t.clone() for t in tensors]


def _layout(optim: torch.optim.Optimizer) -> list[tuple[str, str, torch.dtype, tuple[int, ...], str]]:
    out = []
    for i, state in enumerate(optim.state.values()):
        for key, t in sorted(state.items()):
            local = t.to_local() if hasattr(t, "to_local") else t
            out.append((f"{i}.{key}", type(t).__name__, t.dtype, tuple(local.shape), str(t.device)))
    return out


def test_the_prefilled_state_is_laid_out_as_torchs_own_first_step_makes_it(one_gloo_rank: None) -> None:
    model, optim = _trained()
    skeleton, loaded = _snapshot(model, optim)
    fresh_model, fresh = build(CFG, torch.device("cpu"), lr=1e-2, seed=1, bf16=False, init_weights=False)
    assert prefill(fresh_model, fresh, skeleton["optim"], loaded)
    assert _layout(fresh) == _layout(optim)  # fails if torch.optim moves where it keeps its state


def test_a_load_through_the_prefill_equals_torchs_and_trains_the_same(one_gloo_rank: None) -> None:
    model, optim = _trained()
    skeleton, loaded = _snapshot(model, optim)
    results, seconds = [], []
    for use_prefill in (False, True):
        m, o = build(CFG, torch.device("cpu"), lr=1e-2, seed=7, bf16=False, init_weights=False)
        steps_run: list[int] = []
        hook = o.register_step_pre_hook(lambda *_, run=steps_run: run.append(1))
        t0 = time.perf_counter()
        if use_prefill:
            load_state(m, o, skeleton, loaded, mapped=True)
        else:  # torch's own path: the state made by a step with zero gradients
            with torch.no_grad():
                state = unflatten(skeleton, state_of(m, o), loaded, mapped=True)
            set_state_dict(m, o, model_state_dict=state["model"], optim_state_dict=state["optim"])
        seconds.append(time.perf_counter() - t0)
        hook.remove()
        assert len(steps_run) == (0 if use_prefill else 1)  # torch's path makes the state by a step
        after_load = _snapshot(m, o)[1]
        _step(m, o, 50)
        results.append((after_load, _snapshot(m, o)[1]))
    (loaded_a, trained_a), (loaded_b, trained_b) = results
    assert all(torch.equal(a, b) for a, b in zip(loaded_a, loaded_b, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(loaded_a, loaded, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(trained_a, trained_b, strict=True))
    print(f"load: torch's path {seconds[0]:.3f} s, prefilled {seconds[1]:.3f} s")


def test_a_saved_state_it_cannot_place_leaves_the_optimizer_to_torch(one_gloo_rank: None) -> None:
    model, optim = _trained()
    skeleton, loaded = _snapshot(model, optim)
    renamed = {**skeleton["optim"], "state": {f"other.{k}": v for k, v in skeleton["optim"]["state"].items()}}
    fresh_model, fresh = build(CFG, torch.device("cpu"), lr=1e-2, seed=1, bf16=False, init_weights=False)
    assert not prefill(fresh_model, fresh, renamed, loaded)
    assert not fresh.state
    _step(fresh_model, fresh, 0)  # torch's lazy initialisation, untouched
    assert not prefill(fresh_model, fresh, skeleton["optim"], loaded)  # state already there


def test_an_optimizer_whose_state_is_not_shaped_like_its_parameters_is_left_to_torch(
    one_gloo_rank: None,
) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 6)
    optim = torch.optim.Adafactor(model.parameters(), lr=1e-2)  # row and column factors per matrix
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optim.step()
    skeleton, loaded = _snapshot(model, optim)
    fresh_model = torch.nn.Linear(8, 6)
    fresh = torch.optim.Adafactor(fresh_model.parameters(), lr=1e-2)
    assert not prefill(fresh_model, fresh, skeleton["optim"], loaded) and not fresh.state
    load_state(fresh_model, fresh, skeleton, loaded, mapped=True)  # torch's path
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(fresh_model, fresh)[1], loaded, strict=True))


def test_warm_makes_the_state_by_torchs_zero_step_and_leaves_the_parameters(one_gloo_rank: None) -> None:
    from torch.distributed.checkpoint.state_dict import _init_optim_state  # noqa: F401  fails when torch moves it

    model, optim = _trained()
    skeleton, loaded = _snapshot(model, optim)
    fresh_model, fresh = build(CFG, torch.device("cpu"), lr=1e-2, seed=3, bf16=False)
    before = [p.detach().clone() for p in fresh_model.parameters()]
    steps: list[int] = []
    fresh.register_step_pre_hook(lambda *_: steps.append(1))
    assert warm(fresh)
    assert steps == [1] and _layout(fresh) == _layout(optim)  # torch's own state, by its own step
    after = [p.detach() for p in fresh_model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))  # a learning rate of 0
    assert all(p.grad is None for p in fresh_model.parameters()) and fresh.param_groups[0]["lr"] == 1e-2
    assert not warm(fresh)  # state already there
    load_state(fresh_model, fresh, skeleton, loaded, mapped=True)  # fills the warmed state
    assert steps == [1]
    assert all(torch.equal(a, b) for a, b in zip(_snapshot(fresh_model, fresh)[1], loaded, strict=True))
    _step(model, optim, 50)
    _step(fresh_model, fresh, 50)
    assert all(
        torch.equal(a, b)
        for a, b in zip(_snapshot(fresh_model, fresh)[1], _snapshot(model, optim)[1], strict=True)
    )


def test_warm_leaves_an_optimizer_with_gradients_or_not_of_torch_optim_alone(one_gloo_rank: None) -> None:
    model = torch.nn.Linear(4, 4)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    assert not warm(optim) and not optim.state  # gradients there: not a fresh optimizer

    class Custom(torch.optim.SGD):
        pass

    Custom.__module__ = "my_project.optim"
    other = Custom(torch.nn.Linear(4, 4).parameters(), lr=0.1, momentum=0.9)
    assert not warm(other) and not other.state
