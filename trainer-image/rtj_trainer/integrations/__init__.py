"""Bring your own trainer: what a training script we did not write gets from the runtime.

- `autoreport` (no change to the script): steps and torch.distributed.checkpoint saves seen from
  torch itself, reported for the pod's heartbeat and NVRx's hang detection.
- `session` (a few lines in the script): `Resilience.run(train)` / `fit(build, step_fn, steps)`:
  step reports, in-process restart with the state kept in memory, the memory tier, asynchronous
  checkpoints and the emergency save on SIGTERM.
- `dcp_export`: a checkpoint of ours written out as a torch.distributed.checkpoint one.
- `hf` (Hugging Face Transformers `Trainer`) and `titan` (torchtitan) adapters.

Attributes load lazily: the bootstrap imports `autoreport` at interpreter start, without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Resilience": "session",
    "Attempt": "session",
    "fit": "session",
    "export_dcp": "dcp_export",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
