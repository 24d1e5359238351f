"""Time from an exception in one rank to the first completed step after in-process restart.

NVRx `inprocess.Wrapper` around an FSDP2 training function whose state stays in memory across
the restart (the re-entered function rebuilds the FSDP2 modules on the new process group and
takes the previous iteration's local shards and optimizer state; no checkpoint is read).
Rank 1 raises before step `--fault-step`; every rank logs when it re-entered, when the new
process group answered, and when the first step after the restart completed.

    torchrun --nproc-per-node 2 bench/inprocess_recovery.py --config stock  --dim 2048 --layers 20
    torchrun --nproc-per-node 2 bench/inprocess_recovery.py --config tuned  --dim 2048 --layers 20
    torchrun --nproc-per-node 2 bench/inprocess_recovery.py --config tuned --tiny   # CPU smoke

Configs (`WRAPPER_CONFIGS`): `stock` = the Wrapper's defaults (1 s monitor intervals, 1 s last-call
wait, GPU/NVLink/NIC restart health checks in 0.7); `tuned` = 50 ms monitor intervals and
last-call wait (same soft/hard timeouts), restart health check = CUDA check only.
Rank 0 prints one JSON line `RESULT {...}`; `--out` writes it to a file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer-image"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "operator"))

import itertools

from rtj_trainer import nvrx_patches
from rtj_trainer.examples.fsdp_train import ModelConfig, build, host_float, synthetic_batch

td = datetime.timedelta
WRAPPER_CONFIGS: dict[str, dict[str, Any]] = {
    "stock": {},
    "tuned": {
        "monitor_thread_interval": td(seconds=0.05),
        "monitor_process_interval": td(seconds=0.05),
        "heartbeat_interval": td(seconds=0.05),
        "progress_watchdog_interval": td(seconds=0.05),
        "last_call_wait": td(seconds=0.05),
    },
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--config", choices=sorted(WRAPPER_CONFIGS), default="tuned")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--fault-step", type=int, default=8)
    p.add_argument("--log-dir", default="/tmp/rtj-inproc-bench")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.tiny:
        a.dim, a.layers, a.heads, a.vocab, a.seq, a.batch = 64, 2, 4, 128, 32, 4
    return a


def main() -> None:
    a = parse_args()
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    cfg = ModelConfig(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=a.heads, seq=a.seq)
    os.makedirs(a.log_dir, exist_ok=True)
    log_path = os.path.join(a.log_dir, f"{a.config}-rank{rank}.jsonl")
    if os.path.exists(log_path):
        os.unlink(log_path)
    logf = open(log_path, "a", buffering=1)  # noqa: SIM115

    def note(**rec: Any) -> None:
        logf.write(json.dumps({"t": time.time(), **rec}) + "\n")

    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False").lower() == "true"
    base_store = dist.TCPStore(
        master,
        port,
        world,
        is_master=rank == 0 and not agent_store,
        multi_tenant=True,
        wait_for_workers=False,
        use_libuv=True,
    )
    memory: dict[str, Any] = {}

    def train(call_wrapper: Any = None) -> None:
        it = call_wrapper.iteration
        note(event="enter", iteration=it)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=dist.PrefixStore(f"pg{it}", base_store),
            rank=rank,
            world_size=world,
            timeout=td(seconds=20 if cuda else 1),
        )
        model, optim = build(cfg, device, lr=1e-4, seed=1, bf16=cuda, init_weights="optim" not in memory)
        if "optim" in memory:  # take the state kept in memory by the previous iteration
            # The optimizer holds the sharded DTensor parameters; the module may still hold the
            # unsharded ones if the fault hit inside forward/backward.
            old_optim = memory["optim"]
            olds = [p for g in old_optim.param_groups for p in g["params"]]
            news = [p for g in optim.param_groups for p in g["params"]]
            with torch.no_grad():
                for p_new, p_old in zip(news, olds, strict=True):
                    p_new.to_local().copy_(p_old.to_local())
                    if p_old in old_optim.state:
                        optim.state[p_new] = {
                            k: (
                                type(p_new).from_local(
                                    v.to_local(),
                                    p_new.device_mesh,
                                    p_new.placements,
                                    shape=v.shape,
                                    stride=v.stride(),
                                )
                                if hasattr(v, "to_local")
                                else v
                            )
                            for k, v in old_optim.state[p_old].items()
                        }
        memory["model"], memory["optim"] = model, optim
        note(event="built", iteration=it)
        start = memory.get("step", 0)
        for step in range(start, a.steps):
            if it == 0 and rank == 1 and step + 1 == a.fault_step:
                note(event="fault", iteration=it, step=step + 1)
                raise RuntimeError("injected exception")
            inp, tgt = synthetic_batch(cfg, seed=1, step=step, rank=rank, batch=a.batch, device=device)
            loss = F.cross_entropy(model(inp).float().reshape(-1, cfg.vocab), tgt.reshape(-1))
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            host_float(loss.detach())  # polls: a blocking sync would not see the wrapper's abort
            memory["step"] = step + 1
            note(event="step", iteration=it, step=step + 1)
        dist.barrier()
        dist.destroy_process_group()

    wrapped = nvrx_patches.inprocess_wrapper(
        train,
        store_host=master,
        store_port=port + 2,
        max_iterations=3,
        cuda_health_check=cuda,
        # 0.7 adds GPU/NVLink/NIC probes before every restart (they kill CPU ranks, and cost time).
        gpu_restart_probes=a.config == "stock" and cuda,
        **WRAPPER_CONFIGS[a.config],
    )
    t0 = time.time()
    wrapped()
    logf.close()
    if rank != 0:
        return
    deadline = time.monotonic() + 30
    recs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:  # rank 1's log is complete once it has its last step line
        recs = [x for rr in _by_rank(a.log_dir, a.config, world) for x in rr]
        if sum(1 for x in recs if x["event"] == "step" and x["step"] == a.steps) == world:
            break
        time.sleep(0.1)
    fault = next(x["t"] for x in recs if x["event"] == "fault")
    reenter = max(x["t"] for x in recs if x["event"] == "enter" and x["iteration"] == 1)
    built = max(x["t"] for x in recs if x["event"] == "built" and x["iteration"] == 1)
    per_rank = _by_rank(a.log_dir, a.config, world)
    first = max(min(x["t"] for x in rr if x["event"] == "step" and x["iteration"] == 1) for rr in per_rank)
    before = [x["t"] for x in per_rank[0] if x["event"] == "step" and x["iteration"] == 0]
    gaps = sorted(b - a_ for a_, b in itertools.pairwise(before))
    step_time = gaps[len(gaps) // 2] if gaps else None
    result = {
        "config": a.config,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "world": world,
        "params_b": round(sum(p.numel() for p in memory["model"].parameters()) / 1e9, 3),  # global
        "reenter_s": round(reenter - fault, 3),
        "model_ready_s": round(built - fault, 3),
        "first_step_done_s": round(first - fault, 3),
        "step_time_s": round(step_time, 3) if step_time else None,
        "run_s": round(time.time() - t0, 1),
    }
    print("RESULT " + json.dumps(result), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f)


def _by_rank(log_dir: str, config: str, world: int) -> list[list[dict[str, Any]]]:
    out = []
    for r in range(world):
        with open(os.path.join(log_dir, f"{config}-rank{r}.jsonl")) as f:
            out.append([json.loads(line) for line in f if line.strip()])
    return out


if __name__ == "__main__":
    main()
