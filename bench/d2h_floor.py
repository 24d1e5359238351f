"""The device-to-host floor a memory snapshot is measured against: copying `--gb` GB of bf16 from
the GPU into pinned host memory (one tensor, median of `--runs`), and into a file of /dev/shm
mapped shared and registered with CUDA as the memory tier's ring does (rtj_trainer.checkpoint
.snapshot_ring). Prints one JSON line.

    python bench/d2h_floor.py --gb 13.7 --out $OUT/d2h_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch


def timed_copies(dst: torch.Tensor, src: torch.Tensor, runs: int) -> float:
    seconds = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=13.7)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    n = int(a.gb * 1e9) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    out: dict[str, float] = {"gb": a.gb, "pinned_s": timed_copies(pinned, src, a.runs)}
    del pinned
    fd, path = tempfile.mkstemp(dir=a.dir, prefix="rtj-floor-")
    try:
        t0 = time.perf_counter()
        os.posix_fallocate(fd, 0, 2 * n)
        out["fallocate_s"] = time.perf_counter() - t0
        mapped = torch.from_file(path, shared=True, size=2 * n, dtype=torch.uint8)
        t0 = time.perf_counter()
        rc = int(torch.cuda.cudart().cudaHostRegister(mapped.data_ptr(), mapped.numel(), 0))
        out["register_s"], out["register_rc"] = time.perf_counter() - t0, rc
        out["shm_registered_s"] = timed_copies(mapped.view(torch.bfloat16), src, a.runs)
        t0 = time.perf_counter()
        back = torch.empty_like(src)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        back.copy_(mapped.view(torch.bfloat16), non_blocking=True)
        torch.cuda.synchronize()
        out["h2d_registered_s"] = time.perf_counter() - t0
        torch.cuda.cudart().cudaHostUnregister(mapped.data_ptr())
        t0 = time.perf_counter()
        back.copy_(mapped.view(torch.bfloat16))
        torch.cuda.synchronize()
        out["h2d_pageable_s"] = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    for k in ("pinned_s", "shm_registered_s", "h2d_registered_s", "h2d_pageable_s"):
        out[k.replace("_s", "_gb_per_s")] = round(a.gb / out[k], 1)
    line = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})
    print(line)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
