"""integrations.autoreport: the steps of a script that reports nothing, read from its optimizer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from rtj_trainer import report, runtime_env
from rtj_trainer.integrations import autoreport
from torch.distributed.checkpoint.state_dict import _init_optim_state
from torch.optim.optimizer import register_optimizer_step_post_hook

pytestmark = pytest.mark.unit


class FakeReporter:
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.checkpoints: list[int] = []
        self.states: list[str] = []

    def step(self, n: int) -> None:
        self.steps.append(n)

    def checkpoint_committed(self, step: int, when: Any = None) -> None:
        self.checkpoints.append(step)

    def state(self, state: str) -> None:
        self.states.append(state)

    def finished(self) -> None:
        self.states.append("Finished")


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[autoreport.StepObserver, FakeReporter]]:
    """An observer on torch's real global optimizer hook, as autoreport installs it."""
    monkeypatch.setattr(report, "_explicit_pid", None)
    fake = FakeReporter()
    obs = autoreport.StepObserver(lambda: fake)
    handle = register_optimizer_step_post_hook(obs.on_optimizer_step)
    yield obs, fake
    handle.remove()


def _model() -> torch.nn.Module:
    return torch.nn.Linear(4, 1)


def _train(optim: torch.optim.Optimizer, model: torch.nn.Module, n: int) -> None:
    for _ in range(n):
        model(torch.ones(2, 4)).sum().backward()
        optim.step()
        optim.zero_grad()


def test_adam_steps_are_the_optimizers_own(observed) -> None:
    _obs, fake = observed
    model = _model()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    _train(optim, model, 3)
    assert fake.steps == [1, 2, 3]
    assert fake.states == ["Training"]


def test_a_resumed_optimizer_reports_the_step_it_resumed_at(observed) -> None:
    _obs, fake = observed
    trained = _model()
    first = torch.optim.AdamW(trained.parameters(), lr=0.1)
    _train(first, trained, 20)
    fake.steps.clear()
    model = _model()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    # DCP's get_state_dict initialises a fresh optimizer with a zero-lr step: not a training step.
    _init_optim_state(optim)
    optim.load_state_dict(first.state_dict())
    _train(optim, model, 2)
    assert fake.steps == [21, 22]


def test_an_optimizer_without_a_step_state_is_counted(observed) -> None:
    _obs, fake = observed
    model = _model()
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(optim, model, 3)
    assert fake.steps == [1, 2, 3]


def test_the_newest_of_several_optimizers_is_the_step(observed) -> None:
    _obs, fake = observed
    a, b = _model(), _model()
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    _train(oa, a, 1)
    _train(ob, b, 1)
    _train(oa, a, 1)
    assert fake.steps == [1, 1, 2]


def test_saves_and_the_end_are_reported(observed) -> None:
    obs, fake = observed
    obs.on_checkpoint_saved()  # before any step: nothing to name
    model = _model()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    _train(optim, model, 4)
    obs.on_checkpoint_saved()
    obs.on_destroyed()
    assert fake.checkpoints == [4]
    assert fake.states[-1] == "Finished"


def test_a_script_with_its_own_reporter_is_left_alone(observed, tmp_path) -> None:
    _obs, fake = observed
    report.RankReporter(str(tmp_path))  # the script's own (our API, an adapter)
    model = _model()
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    _train(optim, model, 2)
    assert fake.steps == [] and fake.states == []


def test_enabled_only_under_the_runtime_and_not_turned_off() -> None:
    assert not autoreport.enabled({})
    assert autoreport.enabled({"RTJ_STATUS_DIR": "/s"})
    assert not autoreport.enabled({"RTJ_STATUS_DIR": "/s", autoreport.ENV_AUTO_REPORT: "0"})


def test_the_ranks_pythonpath_starts_with_the_bootstrap() -> None:
    assert runtime_env.AUTOREPORT_BOOTSTRAP_DIR == autoreport.BOOTSTRAP_DIR
    assert os.path.isfile(os.path.join(autoreport.BOOTSTRAP_DIR, "sitecustomize.py"))
    boot = autoreport.BOOTSTRAP_DIR
    assert runtime_env.ranks_pythonpath(None) == boot
    assert runtime_env.ranks_pythonpath(f"/a{os.pathsep}{boot}") == f"{boot}{os.pathsep}/a"
