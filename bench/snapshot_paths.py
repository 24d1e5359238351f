"""The memory tier's GPU path (rtj_trainer.checkpoint.device_stage) next to its floors, each timed
on its own and, for the background parts, with a GPU-bound loop running beside them (its slowdown is
what training would pay). One JSON line.

    PYTHONPATH=trainer-image:operator python bench/snapshot_paths.py --gb 13.7 --dir /dev/shm

Rows: the state (many fp32 tensors) staged into the flat GPU buffer (`DeviceStage.stage`: what a
step waits for); device -> one pinned buffer of the state's size (the device-to-host floor) and the
time to pin it; `populate` of the slot file; device -> the mapped file directly (pageable) and back;
the drain through the pinned chunks (`ChunkPipe.to_host`) with 1..16 copy threads, alone and beside
the loop; the load back (`ChunkPipe.to_device`), checked bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import torch
from rtj_trainer.checkpoint.device_stage import ChunkPipe, DeviceStage
from rtj_trainer.checkpoint.snapshot_ring import layout, populate

MiB = 1 << 20


def cuda_seconds(fn: Callable[[], None], runs: int = 3) -> float:
    out = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


class Loop:
    """A GPU-bound stand-in for training: matmuls with a sync per 'step'."""

    def __init__(self) -> None:
        self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        self.stop = threading.Event()
        self.steps: list[float] = []

    def step(self) -> None:
        for _ in range(20):
            self.a = torch.tanh(self.a @ self.a * 1e-4)
        torch.cuda.synchronize()

    def rate(self, seconds: float) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            self.step()
            n += 1
        return n / (time.perf_counter() - t0)

    def beside(self, fn: Callable[[], None]) -> tuple[float, float]:
        """(seconds fn took, the loop's steps/s meanwhile)."""
        done = threading.Event()
        spent = [0.0]

        def run() -> None:
            t0 = time.perf_counter()
            fn()
            spent[0] = time.perf_counter() - t0
            done.set()

        th = threading.Thread(target=run)
        n, t0 = 0, time.perf_counter()
        th.start()
        while not done.is_set():
            self.step()
            n += 1
        th.join()
        return spent[0], n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=13.7)
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--threads", default="1,4,8,16")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(1)  # as under torchrun (OMP_NUM_THREADS=1)
    nbytes = int(a.gb * 1e9) // MiB * MiB
    out: dict[str, object] = {"gb": a.gb}
    # The state as many fp32 tensors (a model's parameters and optimizer moments).
    sizes = []
    left = nbytes // 4
    while left > 0:
        n = min(left, 2048 * 2048 * (1 + len(sizes) % 3))
        sizes.append(n)
        left -= n
    state = [torch.randn(n, device="cuda") for n in sizes]
    entries, size = layout(state)
    out["tensors"], out["layout_bytes"] = len(state), size
    stage = DeviceStage(threads=1)
    assert stage.prepare(size, torch.cuda.current_device())
    assert stage.flat is not None
    flat = stage.flat
    out["stage_d2d_s"] = cuda_seconds(lambda: stage.stage(state, entries))

    t0 = time.perf_counter()
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    out["pin_whole_s"] = time.perf_counter() - t0
    out["d2h_pinned_floor_s"] = cuda_seconds(lambda: pinned.copy_(flat, non_blocking=True))
    pinned = torch.empty(0)

    fd, path = tempfile.mkstemp(dir=a.dir, prefix="rtj-paths-")
    os.posix_fallocate(fd, 0, size)
    os.close(fd)
    mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    t0 = time.perf_counter()
    populate(mapped)
    out["populate_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mapped.copy_(flat)
    out["d2h_pageable_file_s"] = time.perf_counter() - t0
    out["h2d_file_direct_s"] = cuda_seconds(lambda: flat.copy_(mapped), runs=1)
    save(out, a.out)

    loop = Loop()
    loop.step()
    out["loop_steps_per_s"] = base = loop.rate(5.0)
    back = torch.empty_like(flat)
    device = torch.cuda.current_device()
    for th in [int(x) for x in a.threads.split(",")]:
        pipe = ChunkPipe(device, th, load_threads=th)
        pipe.allocate()
        t0 = time.perf_counter()
        pipe.to_host(flat, mapped)
        out[f"drain_{th}t_s"] = time.perf_counter() - t0
        spent, rate = loop.beside(lambda pipe=pipe: pipe.to_host(flat, mapped))
        out[f"drain_{th}t_beside_s"], out[f"drain_{th}t_loop_relative"] = spent, rate / base
        back.zero_()
        t0 = time.perf_counter()
        pipe.to_device(mapped, back)
        out[f"load_{th}t_s"] = time.perf_counter() - t0
        out[f"load_{th}t_exact"] = bool(torch.equal(back, flat))
        pipe.close()
        save(out, a.out)

    def staged_snapshot() -> None:
        stage.stage(state, entries)
        torch.cuda.synchronize()

    _spent, rate = loop.beside(staged_snapshot)
    out["stage_beside_loop_relative"] = rate / base
    os.unlink(path)
    print(save(out, a.out))


def save(out: dict[str, object], path: str | None) -> str:
    """The rows so far as one JSON line, also written to `path` (a run cut short keeps its rows)."""
    line = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})
    if path:
        with open(path, "w") as f:
            f.write(line + "\n")
    return line


if __name__ == "__main__":
    main()
