"""Is a resume exact? fsdp_train's model and AdamW (one process, FSDP2 on one rank), trained some
steps and saved by CheckpointManager to both tiers; fresh models then load each tier and every
parameter and optimizer-state tensor is compared bitwise with the live one, and the next step's
loss with the live run's.

    python bench/gpu_resume_exact.py [--dim 2048 --layers 20 ...]     # GPU (NCCL) or CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.examples.fsdp_train import ModelConfig, build, synthetic_batch


def flat_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {
        f"param/{n}": (p.to_local() if hasattr(p, "to_local") else p).detach().cpu().clone()
        for n, p in model.named_parameters()
    }
    for i, st in optim.state_dict()["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                out[f"optim/{i}/{k}"] = (v.to_local() if hasattr(v, "to_local") else v).detach().cpu().clone()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    cuda = torch.cuda.is_available()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    cfg = ModelConfig(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=a.heads, seq=a.seq)
    work = tempfile.mkdtemp(prefix="rtj-resume-exact-")
    shm = tempfile.mkdtemp(prefix="rtj-resume-exact-", dir="/dev/shm")

    def step(model: torch.nn.Module, optim: torch.optim.Optimizer, s: int) -> float:
        x, y = synthetic_batch(cfg, seed=0, step=s, rank=0, batch=a.batch, device=device)
        loss = F.cross_entropy(model(x).float().reshape(-1, cfg.vocab), y.reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        return float(loss.detach())

    def manager() -> CheckpointManager:
        return CheckpointManager(work, rank=0, world_size=1, interval_steps=a.steps, local_root=shm,
                                 local_interval_steps=a.steps)  # fmt: skip

    model, optim = build(cfg, device, lr=1e-3, seed=0, bf16=cuda)
    mgr = manager()
    for s in range(a.steps):
        step(model, optim, s)
        if s == 0:
            mgr.prepare(model, optim)
    assert mgr.wait_local(600), "the pinned buffers were not ready"
    assert mgr.maybe_save(a.steps, model, optim) == "saved", "the save was not taken"
    assert mgr.wait(600), "the save did not commit"
    live = flat_state(model, optim)
    next_loss = step(model, optim, a.steps)
    result: dict[str, object] = {"tensors": len(live), "next_loss_live": next_loss}
    for tier in ("local", "persistent"):
        if tier == "persistent":
            for name in os.listdir(os.path.join(shm)):
                os.rename(os.path.join(shm, name), os.path.join(shm, f"gone-{name}"))
        m2, o2 = build(cfg, device, lr=1e-3, seed=1, bf16=cuda, init_weights=False)
        t0 = time.perf_counter()
        resumed = manager().load_latest(m2, o2)
        seconds = time.perf_counter() - t0
        assert resumed is not None and resumed.source == tier, resumed
        got = flat_state(m2, o2)
        differ = sorted(k for k in live if k not in got or not torch.equal(live[k], got[k]))
        result[tier] = {
            "load_s": round(seconds, 3),
            "differ": len(differ),
            "first_differing": differ[:5],
            "next_loss": step(m2, o2, a.steps),
        }
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
