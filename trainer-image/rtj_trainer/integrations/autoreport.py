"""Steps and checkpoints of a script that reports nothing itself, seen from torch.

A plain torchrun script (no import of ours) runs as a job's command; the entrypoint puts
`BOOTSTRAP_DIR` first on its ranks' PYTHONPATH, so its `sitecustomize` calls `install_on_import()`
in every rank at interpreter start. Nothing is imported then; once the script imports torch:

- every `optimizer.step()` (a global post-hook, `register_optimizer_step_post_hook`) is a training
  step. The step number is the optimizer's own (Adam-family `state["step"]`, restored by a resume
  from the script's checkpoint; read at every step while it is a CPU tensor, else once and counted
  on), so a resumed run reports the steps it resumed at, not 1. It goes into the rank's status
  file (the pod heartbeat's step: the progress watchdog, steps lost) and sends NVRx's rank
  heartbeat, which turns on ft_launcher's hang detection: a rank with no optimizer step for
  rankHangTimeoutSeconds is restarted (so that timeout must cover the script's longest pause
  between steps: evaluation, saving);
- every `torch.distributed.checkpoint.save` that returns is a committed checkpoint of the current
  step (DCP writes `.metadata` last, after every rank wrote): the heartbeat's checkpoint and NVRx's
  checkpoint iteration file (no-progress detection across restarts);
- `torch.distributed.destroy_process_group()` of the default group is the end of training: the
  rank reports Finished (a rank that exits without it reads as ended while training).

A script that creates its own `RankReporter` (our integration API, the adapters) reports itself:
the hooks stand down in that process. `RTJ_AUTO_REPORT=0` turns all of it off.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

ENV_AUTO_REPORT = "RTJ_AUTO_REPORT"
#: The directory holding the `sitecustomize.py` that installs this module in every rank (the same
#: as runtime_env.AUTOREPORT_BOOTSTRAP_DIR, which the entrypoint puts on the ranks' PYTHONPATH).
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autoreport-site")
_WRAPPED = "__rtj_autoreport__"


def enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    """Under the trainer runtime (a status dir to report into) and not turned off."""
    return bool(environ.get("RTJ_STATUS_DIR")) and environ.get(ENV_AUTO_REPORT, "1") != "0"


def optimizer_state_step(optimizer: Any) -> tuple[int, bool] | None:
    """The optimizer's own step count (Adam-family state["step"]) and whether it is free to read
    (a number or a CPU tensor; a GPU tensor costs a sync), or None (no such state: plain SGD)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            value = optimizer.state.get(p, {}).get("step")
            if value is not None:
                cheap = not hasattr(value, "device") or value.device.type == "cpu"
                return int(value), cheap
    return None


def zero_lr(optimizer: Any) -> bool:
    """Every group's learning rate is 0: torch.distributed.checkpoint's get_state_dict initialises a
    fresh optimizer's state with such a step (`_init_optim_state`), which is no training step."""
    return all(float(g.get("lr", 1.0)) == 0.0 for g in optimizer.param_groups)


class StepObserver:
    """What the hooks report; one per process (a forked rank gets its own reporter)."""

    def __init__(self, reporter_factory: Callable[[], Any] | None = None) -> None:
        self._factory = reporter_factory or _reporter_from_env
        self._reporter: Any = None
        self._pid: int | None = None
        #: optimizer -> its step, as last counted.
        self._steps: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        #: Optimizers whose own step is read at every step (free to read), not counted on.
        self._cheap: weakref.WeakSet[Any] = weakref.WeakSet()
        self.step = 0

    def _active_reporter(self) -> Any | None:
        from rtj_trainer.report import explicit_reporter_active

        if explicit_reporter_active():
            return None
        if self._pid != os.getpid():  # first call in this process, or a fork of it
            from rtj.contract import PodState

            self._reporter, self._pid = self._factory(), os.getpid()
            self._steps, self._cheap = weakref.WeakKeyDictionary(), weakref.WeakSet()
            self._reporter.state(PodState.TRAINING)
        return self._reporter

    def on_optimizer_step(self, optimizer: Any, _args: Any = None, _kwargs: Any = None) -> None:
        reporter = self._active_reporter()
        if reporter is None:
            return
        before = self._steps.get(optimizer)
        if before is None and zero_lr(optimizer):
            return  # not a step yet; the next one reads the (by then perhaps loaded) state
        own = optimizer_state_step(optimizer) if before is None or optimizer in self._cheap else None
        if own is not None:
            now = own[0]
            if own[1]:
                self._cheap.add(optimizer)
        else:
            now = (before or 0) + 1
        self._steps[optimizer] = now
        self.step = max(self._steps.values())
        reporter.step(self.step)

    def on_destroyed(self) -> None:
        reporter = self._active_reporter() if self._pid == os.getpid() else None
        if reporter is not None:
            reporter.finished()

    def on_checkpoint_saved(self) -> None:
        reporter = self._active_reporter()
        if reporter is not None and self.step > 0:
            reporter.checkpoint_committed(self.step)


def _reporter_from_env() -> Any:
    from rtj_trainer.report import RankReporter

    return RankReporter.from_env(automatic=True)


_observer = StepObserver()


def observer() -> StepObserver:
    return _observer


_hook_handle: Any = None


def install_optimizer_hook(_module: ModuleType | None = None) -> None:
    global _hook_handle
    if _hook_handle is None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _hook_handle = register_optimizer_step_post_hook(_observer.on_optimizer_step)


def wrap_dcp_save(module: ModuleType) -> None:
    """`module.save` (torch.distributed.checkpoint, and its state_dict_saver) reports each save that
    returned. Idempotent."""
    targets = [module]
    saver = sys.modules.get("torch.distributed.checkpoint.state_dict_saver")
    if saver is not None:
        targets.append(saver)
    for target in targets:
        original = getattr(target, "save", None)
        if original is not None and not getattr(original, _WRAPPED, False):
            target.save = _reporting_save(original)  # type: ignore[attr-defined]


def _reporting_save(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def save(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _observer.on_checkpoint_saved()
        return result

    setattr(save, _WRAPPED, True)
    return save


def wrap_destroy_process_group(module: ModuleType) -> None:
    """`destroy_process_group()` of the default group (torch.distributed, distributed_c10d) reports
    the rank finished. Idempotent."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    for target in {id(m): m for m in (module, c10d) if m is not None}.values():
        original = getattr(target, "destroy_process_group", None)
        if original is not None and not getattr(original, _WRAPPED, False):
            target.destroy_process_group = _finishing_destroy(original)  # type: ignore[attr-defined]


def _finishing_destroy(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def destroy_process_group(group: Any = None) -> Any:
        result = original(group)
        if group is None:
            _observer.on_destroyed()
        return result

    setattr(destroy_process_group, _WRAPPED, True)
    return destroy_process_group


#: Module name -> what to do once it has been imported.
_AFTER_IMPORT: dict[str, Callable[[ModuleType], Any]] = {
    "torch.optim.optimizer": install_optimizer_hook,
    "torch.distributed.checkpoint": wrap_dcp_save,
    "torch.distributed": wrap_destroy_process_group,
}


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback right after one of `_AFTER_IMPORT`'s modules executed (found by the other
    finders; this one only wraps the loader)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        callback = _AFTER_IMPORT.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module: ModuleType) -> None:
            exec_module(module)
            try:
                callback(module)
            except Exception as exc:  # never break the script's import
                print(f"rtj autoreport: {name}: {exc!r}", file=sys.stderr)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]
        return spec


def install_on_import() -> bool:
    """Arrange the hooks for when the script imports torch (at once if it did already)."""
    if not enabled():
        return False
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
    for name, callback in _AFTER_IMPORT.items():
        if name in sys.modules:
            callback(sys.modules[name])
    return True
