"""Leave with your checkpoints: a checkpoint of ours written out as a torch.distributed.checkpoint one.

Our format (rtj_trainer.checkpoint_format) stores each rank's local shards plus a manifest; it is
fast to write and to load at the same world size, but torch.distributed.checkpoint (DCP) cannot
read it. `export_dcp` loads the newest committed step into the job's own model and optimizer (the
same world size, as the job runs) and saves them with `dcp.save` under the usual keys
`{"model": ..., "optim": ...}` (torch.distributed.checkpoint.state_dict's get_state_dict): a DCP
checkpoint with global tensor metadata, which `dcp.load` reshards onto any world size and
`torch.distributed.checkpoint.format_utils.dcp_to_torch_save` turns into one torch.save file.

    from rtj_trainer.integrations import export_dcp
    model, optim = build(...)                      # as for training, on every rank
    step = export_dcp(model, optim, "/checkpoints/dcp/final")   # newest committed step, or None
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.runtime_env import RankEnv


def export_dcp(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dest: str,
    *,
    checkpoint_dir: str | None = None,
    manager: CheckpointManager | None = None,
) -> int | None:
    """Write the newest committed checkpoint under `checkpoint_dir` (default: the pod's) to `dest`
    as a DCP checkpoint; returns its step (None: nothing committed, nothing written). A collective:
    every rank calls it, with the model and optimizer built as for training."""
    if manager is None:
        env = RankEnv.from_env()
        manager = CheckpointManager(
            checkpoint_dir or env.checkpoint_dir,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            interval_steps=1,
        )
    resumed = manager.load_latest(model, optimizer)
    if resumed is None:
        return None
    msd, osd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    dcp.save(state, checkpoint_id=dest)
    return resumed.step
