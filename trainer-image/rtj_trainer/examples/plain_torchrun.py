"""A plain torchrun training script that knows nothing of the operator: DDP, AdamW and its own
torch.distributed.checkpoint (DCP) saves and resume. No import of rtj or rtj_trainer.

    torchrun --nproc-per-node 2 plain_torchrun.py --steps 100 --save-dir /ckpt/plain --save-every 10

It runs unchanged as a job's `command`: under the trainer runtime it gets ft_launcher's in-job
restart and its steps and saves are seen from torch itself (rtj_trainer.integrations.autoreport).
One JSON line per step on stdout (`{"step": ..., "loss": ..., "rank": ..., "pid": ...}`) and,
with `--log-file`, in that file as well (`{rank}` in it is the rank).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel


def latest_checkpoint(save_dir: str) -> tuple[int, str] | None:
    """(step, path) of the newest complete DCP checkpoint (`.metadata` is written last)."""
    found = []
    for name in os.listdir(save_dir) if os.path.isdir(save_dir) else []:
        path = os.path.join(save_dir, name)
        if name.startswith("step-") and os.path.exists(os.path.join(path, ".metadata")):
            found.append((int(name.removeprefix("step-")), path))
    return max(found) if found else None


def batch(step: int, rank: int, size: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(size, dim, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--save-dir", default="checkpoints")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-seconds", type=float, default=0.0, help="pad each step to this long")
    p.add_argument("--log-file", default=None)
    args = p.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(nn.Linear(args.dim, 64), nn.ReLU(), nn.Linear(64, 1)))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    if (found := latest_checkpoint(args.save_dir)) is not None:
        start, path = found
        msd, osd = get_state_dict(model, optim)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    log = open(args.log_file.replace("{rank}", str(rank)), "a", buffering=1) if args.log_file else None  # noqa: SIM115
    if log:
        log.write(json.dumps({"event": "resume", "step": start, "pid": os.getpid(), "t": time.time()}) + "\n")
    for step in range(start, args.steps):
        t0 = time.perf_counter()
        x, y = batch(step, rank, 16, args.dim)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        if (step + 1) % args.save_every == 0:
            msd, osd = get_state_dict(model, optim)
            dcp.save(
                {"model": msd, "optim": osd}, checkpoint_id=os.path.join(args.save_dir, f"step-{step + 1}")
            )
        time.sleep(max(0.0, args.step_seconds - (time.perf_counter() - t0)))
        rec = {
            "step": step + 1,
            "loss": round(float(loss), 5),
            "rank": rank,
            "pid": os.getpid(),
            "t": time.time(),
        }
        print(json.dumps(rec), flush=True)
        if log:
            log.write(json.dumps(rec) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
