"""How much a background host copy takes from the main thread: torch's `copy_` against the memory
tier's `copy_bytes` (one memmove in the copying thread).

A memory snapshot drains into `/dev/shm` in a writer thread while training goes on in the main
thread, whose rate of small operations (a training step's kernel launches) is what a busy CPU
slows. This runs, for `--seconds` each, the main thread doing small torch ops while a background
thread copies `--chunk-mib` pieces (with a short pause per piece, as a drain waits for each chunk
to leave the GPU) by each method, and prints the main thread's rate against the run with no copy,
and the bytes copied per second.

    PYTHONPATH=trainer-image python bench/host_copy_interference.py [--torch-threads N] [--out F]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import torch
from rtj_trainer.checkpoint.device_stage import copy_bytes

METHODS = ("none", "torch-copy", "copy_bytes")


def run(method: str, seconds: float, chunk_mib: int, pause_s: float) -> dict[str, float]:
    src = torch.ones(chunk_mib << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    stop = threading.Event()
    copied = [0]

    def copier() -> None:
        while not stop.is_set():
            if method == "torch-copy":
                dst.copy_(src)
            elif method == "copy_bytes":
                copy_bytes(dst, src)
            else:
                time.sleep(pause_s)
                continue
            copied[0] += src.numel()
            time.sleep(pause_s)

    thread = threading.Thread(target=copier, daemon=True)
    thread.start()
    x = torch.ones(256)
    ops = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            x = x + 1
        ops += 1000
    elapsed = time.perf_counter() - t0
    stop.set()
    thread.join()
    return {"main_ops_per_s": ops / elapsed, "copy_gb_per_s": copied[0] / elapsed / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--chunk-mib", type=int, default=64)
    p.add_argument("--pause-ms", type=float, default=2.0)
    p.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--rounds", type=int, default=2, help="each method this many times, interleaved")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
    for _ in range(a.rounds):
        for m in METHODS:
            runs[m].append(run(m, a.seconds, a.chunk_mib, a.pause_ms / 1000))
    base = max(r["main_ops_per_s"] for r in runs["none"])
    out = {"torch_threads": torch.get_num_threads(), "chunk_mib": a.chunk_mib, "runs": runs}
    for m in METHODS:
        rel = [round(r["main_ops_per_s"] / base, 3) for r in runs[m]]
        gbs = [round(r["copy_gb_per_s"], 2) for r in runs[m]]
        out[m] = {"main_thread_rate_relative": rel, "copy_gb_per_s": gbs}
        print(f"{m:10s} main thread {rel} of the rate with no copy; copied {gbs} GB/s")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
