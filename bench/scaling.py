"""Tokens/s per GPU at 1 and N GPUs, resilience ON vs OFF, same script, one run.

ON  = rtj_trainer.examples.fsdp_train as shipped: in-process restart wrapper + async checkpoints
      every `--interval` steps (+ reporter).
OFF = the same script with RTJ_INPROCESS_ENABLED=0 and --no-checkpoint.
Each configuration is a fresh `torchrun` of the script; throughput counts steps after `--warmup`
(saves included), from the script's per-rank step logs.

    python bench/scaling.py --gpus 1,2 --steps 60 --interval 20 -- --dim 2048 --layers 20 \
        --vocab 32000 --seq 2048 --batch 4 --heads 16
    python bench/scaling.py --gpus 1,2 --steps 12 --interval 4 --cpu     # CPU smoke (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_one(nproc: int, on: bool, a: argparse.Namespace, train_args: list[str], port: int) -> dict:
    tag = f"{nproc}gpu-{'on' if on else 'off'}"
    work = Path(a.dir) / tag
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "trainer-image"), str(ROOT / "operator"), os.environ.get("PYTHONPATH", "")]
        ),
        "RTJ_CHECKPOINT_DIR": str(work / "ckpt"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": str(a.interval),
        "RTJ_INPROCESS_ENABLED": "1" if on else "0",
        "RTJ_DIST_BACKEND": "gloo" if a.cpu else "nccl",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        f"--master-port={port}",
        "-m",
        "rtj_trainer.examples.fsdp_train",
        "--steps",
        str(a.steps),
        "--log-dir",
        str(work / "logs"),
        *([] if on else ["--no-checkpoint"]),
        *train_args,
    ]
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", file=sys.stderr)
        return {"config": tag, "error": f"exit {proc.returncode}"}
    per_rank = []
    for r in range(nproc):
        recs = [json.loads(x) for x in (work / "logs" / f"rank-{r}.jsonl").read_text().splitlines()]
        steps = [x for x in recs if "loss" in x and x["step"] > a.warmup]
        per_rank.append(steps)
    # The slowest rank sets the pace; the tokens of one step per rank: batch * seq.
    seconds = max(sum(x["dt"] for x in steps) for steps in per_rank)
    n_steps = len(per_rank[0])
    tokens_per_gpu = a.batch * a.seq * n_steps / seconds
    saves = sum(1 for x in per_rank[0] if x.get("save") == "saved")
    skipped = sum(1 for x in per_rank[0] if x.get("save") == "skipped")
    shutil.rmtree(work / "ckpt", ignore_errors=True)
    return {
        "config": tag,
        "gpus": nproc,
        "resilience": on,
        "steps_timed": n_steps,
        "seconds": round(seconds, 3),
        "tokens_per_s_per_gpu": round(tokens_per_gpu, 1),
        "saves": saves,
        "skipped": skipped,
        "final_loss": per_rank[0][-1]["loss"],
        "wall_s": round(wall, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", default="1,2")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--interval", type=int, default=20)
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--dir", default="/tmp/rtj-scaling")
    p.add_argument("--out", default=None)
    p.add_argument("--timeout", type=float, default=400)
    a, train_args = p.parse_known_args()
    train_args = [x for x in train_args if x != "--"]
    # The script's own defaults unless given after "--".
    a.batch = int(train_args[train_args.index("--batch") + 1]) if "--batch" in train_args else 8
    a.seq = int(train_args[train_args.index("--seq") + 1]) if "--seq" in train_args else 64
    rows = []
    port = 29750
    for n in [int(x) for x in a.gpus.split(",")]:
        for on in (False, True):
            port += 3
            rows.append(run_one(n, on, a, train_args, port))
            print("[scaling]", json.dumps(rows[-1]), flush=True)
    lines = [
        "| GPUs | resilience | tokens/s per GPU | ON / OFF | saves (skipped) | final loss |",
        "|---|---|---|---|---|---|",
    ]
    by = {(r.get("gpus"), r.get("resilience")): r for r in rows if "error" not in r}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | error: {r['error']} | | | | |")
            continue
        off = by.get((r["gpus"], False))
        ratio = (
            f"{r['tokens_per_s_per_gpu'] / off['tokens_per_s_per_gpu']:.1%}"
            if off and r["resilience"]
            else "-"
        )
        mode = "ON" if r["resilience"] else "OFF"
        lines.append(
            f"| {r['gpus']} | {mode} | {r['tokens_per_s_per_gpu']:.0f} | {ratio} | "
            f"{r['saves']} ({r['skipped']}) | {r['final_loss']} |"
        )
    one = by.get((1, True))
    for n in sorted({r["gpus"] for r in by.values()}):
        if n > 1 and one and (n, True) in by:
            eff = by[(n, True)]["tokens_per_s_per_gpu"] / one["tokens_per_s_per_gpu"]
            lines.append(f"scaling efficiency ON, {n} GPUs vs 1: {eff:.1%} (tokens/s per GPU)")
    table = "\n".join(lines)
    print(table, flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows, "table": table}, indent=1))


if __name__ == "__main__":
    main()
