"""Training stall per checkpoint: none vs torch DCP save vs DCP async_save vs rtj_trainer.checkpoint.

One run, one model (FSDP2, AdamW, bf16 compute on GPU, fp32 master weights), the same steps for
every mode; launch with torchrun (2 GPUs) or on CPU with gloo for a smoke run:

    torchrun --nproc-per-node 2 bench/ckpt_stall.py --dim 2048 --layers 20 --vocab 32000 \
        --seq 2048 --batch 4 --steps 60 --interval 20 --dir /tmp/ckbench --out results.json
    torchrun --nproc-per-node 2 bench/ckpt_stall.py --tiny        # CPU smoke run

Baselines (the same steps, no saves) are interleaved with the modes, after a warm-up: B M1 B M2 ...
Mk B. Each mode is compared with the mean of the two baselines around it, so a baseline run first
and cold (or any drift of the machine) cannot make a mode look better than no checkpointing.

Figures (rank 0 prints the table; per-rank worst):
- stall per save: step time of the save step and the step after it, minus twice the median step
  of the mode's two baselines (ours overlaps the GPU copy with the next step, so both steps count);
- efficiency @ every N steps: baseline time / time of the same steps with saves;
- efficiency @ one save per 60 s: 60 / (60 + mean stall), from the measured stalls;
- recency: the age of the newest committed checkpoint (the work a crash would lose), averaged over
  every step, in steps and seconds, next to what committing at once at every interval gives; a
  skipped or late save leaves the previous checkpoint in place, so it counts here;
- floor: time to copy the rank's whole state to pinned host memory (synchronous, median of 3).
An efficiency above 100% cannot be a real figure and is never printed as one: within the noise (the
two baselines' spread) it reads "n/a" with the raw ratio and the noise next to it; beyond the noise the
run stops with a measurement error.
Mode "ours (slow storage)" throttles our writer below what the interval needs, so saves are
skipped/coalesced while training is never blocked.
"""

# The per-mode save functions are defined and used inside one loop iteration.
# ruff: noqa: B023
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "trainer-image"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "operator"))

from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.examples.fsdp_train import ModelConfig, build, synthetic_batch


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--tiny", action="store_true", help="CPU smoke sizes")
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--interval", type=int, default=20)
    p.add_argument("--slow-bytes-per-s", type=float, default=300e6, help="throttled writer for the slow mode")
    p.add_argument("--modes", default="dcp_sync,dcp_async,ours,ours_slow", help="baselines run between them")
    p.add_argument("--warmup-steps", type=int, default=None, help="untimed steps first (default: --steps)")
    p.add_argument("--dir", default="/tmp/rtj-ckpt-bench")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.tiny:
        a.dim, a.layers, a.heads, a.vocab, a.seq, a.batch = 64, 2, 4, 128, 32, 4
        a.steps, a.interval, a.slow_bytes_per_s = 12, 4, 2e5
    if a.warmup_steps is None:
        a.warmup_steps = a.steps
    a.modes = ",".join(m for m in a.modes.split(",") if m and m != "baseline")
    return a


def main() -> None:
    a = parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    gloo = dist.new_group(backend="gloo")
    cfg = ModelConfig(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=a.heads, seq=a.seq)
    model, optim = build(cfg, device, lr=1e-4, seed=1, bf16=cuda)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step_no = [0]

    def one_step() -> float:
        t0 = time.perf_counter()
        inp, tgt = synthetic_batch(cfg, seed=1, step=step_no[0], rank=rank, batch=a.batch, device=device)
        loss = F.cross_entropy(model(inp).float().reshape(-1, cfg.vocab), tgt.reshape(-1))
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        float(loss.detach())
        step_no[0] += 1
        return time.perf_counter() - t0

    def run(save_fn: Any = None, committed_fn: Any = None) -> dict[str, Any]:
        """One block of a.steps steps. `committed_fn()`: the newest committed step (None: none yet)."""
        dist.barrier(group=gloo)
        dts, saves, age_steps, age_s = [], [], [], []
        ends = {0: time.perf_counter()}  # no checkpoint yet: a crash loses the block from its start
        for i in range(1, a.steps + 1):
            t0 = time.perf_counter()
            one_step()
            if save_fn is not None and save_fn(i):
                saves.append(i)
            ends[i] = time.perf_counter()
            dts.append(ends[i] - t0)
            if committed_fn is not None:
                newest = committed_fn() or 0
                age_steps.append(i - newest)
                age_s.append(ends[i] - ends[newest])
        out: dict[str, Any] = {"total_s": sum(dts), "median_step_s": statistics.median(dts), "dts": dts}
        out["saves"] = saves
        if committed_fn is not None:
            out.update(recency_steps=statistics.mean(age_steps), recency_s=statistics.mean(age_s))
        return out

    for _ in range(a.warmup_steps):
        one_step()
    if rank == 0:
        print(f"[ckpt_stall] warm: step {one_step():.3f} s", flush=True)
    else:
        one_step()
    params = sum(p.numel() for p in model.parameters())  # DTensor numel: the global size

    # Floor: a synchronous copy of the rank's whole state into (pre-allocated) pinned host memory.
    probe = CheckpointManager(os.path.join(a.dir, "floor"), rank=rank, world_size=world, interval_steps=10**9)
    probe.prepare(model, optim)
    from rtj_trainer.checkpoint import _flatten, _state_of

    tensors: list[torch.Tensor] = []
    _flatten(_state_of(model, optim), tensors)
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)
    floors = []
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for buf, t in zip(probe._host, tensors, strict=True):
            buf.copy_(t, non_blocking=cuda)
        sync()
        floors.append(time.perf_counter() - t0)
    floor = statistics.median(floors)
    del probe, tensors

    results: dict[str, Any] = {}
    modes = a.modes.split(",")
    baselines = [run()]
    for mode in modes:
        mode_dir = os.path.join(a.dir, mode)
        if rank == 0:
            shutil.rmtree(mode_dir, ignore_errors=True)
        dist.barrier(group=gloo)
        extra: dict[str, Any] = {}
        t_start = time.perf_counter()
        if mode == "dcp_sync":
            synced: list[int | None] = [None]

            def save(i: int) -> bool:
                if i % a.interval:
                    return False
                msd, osd = get_state_dict(model, optim)
                dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(mode_dir, f"step-{i}"))
                synced[0] = i  # complete when dcp.save returns
                return True

            block = run(save, lambda: synced[0])
        elif mode == "dcp_async":
            fut: list[Any] = [None]
            in_flight: list[int | None] = [None]
            done: list[int | None] = [None]

            def newest_async() -> int | None:
                if fut[0] is not None and in_flight[0] is not None and fut[0].done():
                    done[0], in_flight[0] = in_flight[0], None
                return done[0]

            def save(i: int) -> bool:
                if i % a.interval:
                    return False
                if fut[0] is not None:
                    fut[0].result()  # DCP allows one save in flight: wait for the previous one
                    newest_async()
                msd, osd = get_state_dict(model, optim)
                fut[0] = dcp.async_save(
                    {"model": msd, "optim": osd},
                    checkpoint_id=os.path.join(mode_dir, f"step-{i}"),
                    process_group=gloo,
                )
                in_flight[0] = i
                return True

            block = run(save, newest_async)
            t_drain = time.perf_counter()
            if fut[0] is not None:
                fut[0].result()
            extra["drain_after_s"] = time.perf_counter() - t_drain
        else:
            mgr = CheckpointManager(
                mode_dir,
                rank=rank,
                world_size=world,
                interval_steps=a.interval,
                keep=2,
                group=gloo,
                write_bytes_per_s=a.slow_bytes_per_s if mode == "ours_slow" else None,
            )
            mgr.prepare(model, optim)
            snaps: list[float] = []
            copies: list[float] = []

            def save(i: int) -> bool:
                if mgr.copy_seconds() is not None and len(copies) < mgr.saves_started:
                    copies.append(mgr.copy_seconds())
                out = mgr.maybe_save(i, model, optim)
                if out == "saved":
                    snaps.append(mgr.last_snapshot_s)
                return out == "saved"

            block = run(save, lambda: mgr.last_committed)
            sync()
            if mgr.copy_seconds() is not None and len(copies) < mgr.saves_started:
                copies.append(mgr.copy_seconds())
            t_drain = time.perf_counter()
            mgr.wait()
            extra.update(
                drain_after_s=time.perf_counter() - t_drain,
                skipped=mgr.saves_skipped,
                committed=mgr.last_committed,
                snapshot_cpu_s=max(snaps) if snaps else None,
                copy_gpu_s=max(copies) if copies else None,
            )
        wall = time.perf_counter() - t_start
        dist.barrier(group=gloo)
        if rank == 0:
            shutil.rmtree(mode_dir, ignore_errors=True)
        baselines.append(run())  # the baseline after this mode (and before the next one)
        before, after = baselines[-2], baselines[-1]
        base_steps = before["dts"] + after["dts"]
        base_median = statistics.median(base_steps)
        dts = block.pop("dts")
        stalls = [
            dts[s - 1] + (dts[s] if s < len(dts) else base_median) - 2 * base_median for s in block["saves"]
        ]
        results[mode] = {
            **block,
            "wall_s": wall,
            "stalls_s": stalls,
            "base_total_s": (before["total_s"] + after["total_s"]) / 2,
            "base_median_step_s": base_median,
            # How far two runs of the very same steps differ here: what no figure can resolve.
            "base_spread": abs(before["total_s"] - after["total_s"])
            / ((before["total_s"] + after["total_s"]) / 2),
            "base_step_stdev_s": statistics.stdev(base_steps) if len(base_steps) > 1 else 0.0,
            **extra,
        }
        if rank == 0:
            print(f"[ckpt_stall] {mode}: {json.dumps(results[mode])}", flush=True)
    results["baseline"] = {"totals_s": [b["total_s"] for b in baselines]}

    # Per-rank figures -> the worst rank decides.
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, results, group=gloo)
    problems: list[str] = []
    if rank == 0:
        table, problems = summarize(gathered, modes, a, floor, state_bytes, params, world)
        print(table, flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(
                    {
                        "args": vars(a),
                        "floor_s": floor,
                        "state_bytes": state_bytes,
                        "params": params,
                        "ranks": gathered,
                        "table": table,
                    },
                    f,
                    indent=1,
                )
    dist.barrier(group=gloo)
    dist.destroy_process_group()
    if problems:
        raise SystemExit("measurement error (a figure better than no checkpointing, beyond the noise):\n"
                         + "\n".join(problems))  # fmt: skip


#: Per-mode figures the table already shows (the others are printed under it, rank 0's).
SUMMARIZED = {"total_s", "wall_s", "median_step_s", "stalls_s", "base_total_s", "base_median_step_s",
              "base_step_stdev_s", "recency_s"}  # fmt: skip


def ratio_cell(value: float, noise: float, what: str, problems: list[str]) -> str:
    """A ratio that cannot exceed 1: printed when <= 1; above 1 within `noise`, the measurement
    cannot resolve it ("n/a", the raw ratio next to it); beyond it, the measurement is wrong (listed
    in `problems`)."""
    if value <= 1.0:
        return f"{value:.1%}"
    if value - 1.0 <= noise:
        return f"n/a (raw {value:.1%}, within the noise ±{noise:.1%})"
    problems.append(f"{what}: {value:.1%} with baselines {noise:.1%} apart")
    return f"INVALID (raw {value:.1%}, noise ±{noise:.1%})"


def summarize(
    per_rank: list[dict[str, Any]],
    modes: list[str],
    a: argparse.Namespace,
    floor: float,
    state_bytes: int,
    params: int,
    world: int,
) -> tuple[str, list[str]]:
    problems: list[str] = []
    ideal_age = statistics.mean(i % a.interval for i in range(1, a.steps + 1))
    totals = [t for r in per_rank for t in r["baseline"]["totals_s"]]
    lines = [
        f"params {params / 1e9:.2f} B, state per rank {state_bytes / 1e9:.2f} GB, "
        f"{a.steps} steps per mode, save every {a.interval} steps, world {world}",
        f"floor (copy of a rank's state to pinned host memory): {floor:.3f} s",
        f"baselines (no saves, between the modes): {len(per_rank[0]['baseline']['totals_s'])} runs, "
        f"{min(totals):.3f}-{max(totals):.3f} s",
        "| mode | median step s | saves | skipped | stall per save s (max over ranks) | mean stall s "
        f"| recency: mean age of newest committed ckpt, steps (at once every N: {ideal_age:.1f}) "
        "| recency s | efficiency @ every N steps | efficiency @ 1 save/60 s | stall / floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode in modes:
        rs = [r[mode] for r in per_rank]
        n = len(rs[0]["saves"])
        stalls = [max(r["stalls_s"][i] for r in rs) for i in range(n)] if n else []
        total = max(r["total_s"] for r in rs)
        base = max(r["base_total_s"] for r in rs)
        spread = max(r["base_spread"] for r in rs)
        mean = statistics.mean(stalls) if stalls else 0.0
        # A stall is two steps minus two median steps: its noise is about sqrt(2) step deviations.
        stall_noise = 3 * math.sqrt(2) * max(r["base_step_stdev_s"] for r in rs)
        eff_n = ratio_cell(base / total, spread, f"{mode} efficiency @ every {a.interval} steps", problems)
        eff_60 = (
            ratio_cell(60.0 / (60.0 + mean), stall_noise / 60.0, f"{mode} efficiency @ 1 save/60 s", problems)
            if stalls
            else "-"
        )
        skipped = rs[0].get("skipped", "-")
        age = max(r.get("recency_steps", 0.0) for r in rs)
        age_s = max(r.get("recency_s", 0.0) for r in rs)
        lines.append(
            f"| {mode} | {statistics.median(r['median_step_s'] for r in rs):.3f} | {n} | {skipped} | "
            f"{', '.join(f'{s:.3f}' for s in stalls) or '-'} | {mean:.3f} | {age:.1f} | {age_s:.2f} | "
            f"{eff_n} | {eff_60} | {(max(stalls) / floor if stalls else 0):.2f} |"
        )
    for mode in modes:
        extra = {k: v for k, v in per_rank[0][mode].items() if k.endswith("_s") and k not in SUMMARIZED}
        if extra:
            lines.append(
                f"{mode} rank0: " + ", ".join(f"{k}={v:.3f}" for k, v in extra.items() if v is not None)
            )
    return "\n".join(lines), problems


if __name__ == "__main__":
    main()
