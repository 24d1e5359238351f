"""Run by torchrun (2 gloo ranks): export the newest checkpoint of fsdp_train's model to DCP with
integrations.dcp_export, load the export back into a differently initialised model with plain
torch.distributed.checkpoint, and record whether every local shard matches.

    torchrun --nproc-per-node 2 dcp_export_job.py CKPT_DIR DEST RESULT_JSON
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from rtj_trainer.examples.fsdp_train import ModelConfig, build
from rtj_trainer.integrations.dcp_export import export_dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def main() -> None:
    ckpt_dir, dest, result = sys.argv[1:4]
    dist.init_process_group("gloo")
    cfg = ModelConfig(dim=64, layers=2)
    device = torch.device("cpu")
    model, optim = build(cfg, device, lr=1e-3, seed=1, bf16=False, init_weights=False)
    step = export_dcp(model, optim, dest, checkpoint_dir=ckpt_dir)
    other, other_optim = build(cfg, device, lr=1e-3, seed=7, bf16=False)
    msd, osd = get_state_dict(other, other_optim)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=dest)
    set_state_dict(other, other_optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    same = all(
        torch.equal(a.to_local(), b.to_local())
        for a, b in zip(model.parameters(), other.parameters(), strict=True)
    )
    if dist.get_rank() == 0:
        with open(result, "w") as f:
            json.dump({"step": step, "same": same}, f)
    # Both ranks leave together: a rank tearing down its gloo pairs while its peer is still busy
    # aborted once in CI (SIGABRT, "terminate called without an active exception").
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
