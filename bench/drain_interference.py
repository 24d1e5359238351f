"""How much a memory snapshot's drain takes from the training thread, by chunk size and copy threads.

The drain (`device_stage.ChunkPipe.to_host`, the product's code) runs in the writer thread while
training goes on in the main thread. Every chunk costs the writer a few round trips through the GIL
(waiting for the chunk's event, its host copy, the next chunk's copy call), and each may hold up the
main thread's next torch call, whose launches are a step's CPU side. This times, for each
(chunk MiB, threads, ring depth), the main thread issuing small torch ops while one drain of `--gib` GiB
runs into a file in `--dir` (a tmpfs: the memory tier), against the same ops with no drain, in
alternation, `--rounds` times.

On a GPU the drained buffer and the main thread's ops are on the GPU (`--device cuda`) and the pipe
uses CUDA streams and pinned chunks, as in a rank; on the CPU (`--device cpu`) a synchronous
stand-in copies the "device" bytes (tests/trainer_ckpt/host_device.py's way), with torch on one
thread.

    PYTHONPATH=trainer-image python bench/drain_interference.py --device cuda --gib 13 --out F
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import torch
from rtj_trainer.checkpoint.device_stage import CUDA, ChunkPipe, CudaOps

#: (chunk MiB, copy threads, chunks in the ring): the defaults before and now, and around them.
CONFIGS = ((64, 4, 4), (64, 1, 4), (256, 1, 2), (256, 1, 4), (256, 2, 2), (512, 1, 2))


class _Done:
    def record(self, stream: object = None) -> None: ...

    def synchronize(self) -> None: ...


class HostOps(CudaOps):
    """The pipe on the CPU: events and streams that are done at once, unpinned chunks."""

    pin = False

    def stream(self) -> Any:
        return None

    def event(self, timing: bool = False) -> Any:
        return _Done()

    def on_device(self, device: int) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def on_stream(self, stream: object) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()


def mapped_file(path: str, nbytes: int) -> torch.Tensor:
    """A tmpfs file of `nbytes`, its pages present, mapped shared (a memory-tier slot)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
        m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED)
    finally:
        os.close(fd)
    t = torch.frombuffer(m, dtype=torch.uint8)
    t.fill_(0)  # every page present, as `snapshot_ring.populate` leaves a slot
    return t


def main_thread_rate(device: torch.device, seconds: float, done: threading.Event | None) -> float:
    """Small torch ops per second until `seconds` passed (or `done` is set, when given)."""
    x = torch.ones(256, device=device)
    ops, t0 = 0, time.perf_counter()
    while True:
        for _ in range(200):
            x = x + 1
        ops += 200
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if (done is not None and done.is_set()) or (done is None and elapsed >= seconds):
            return ops / elapsed


def one(device: torch.device, pipe: ChunkPipe, src: torch.Tensor, dst: torch.Tensor) -> dict[str, float]:
    done = threading.Event()
    spent: dict[str, float] = {}

    def drain() -> None:
        t0 = time.perf_counter()
        event = pipe.to_host(src, dst)
        if device.type == "cuda":
            event.synchronize()
        spent["drain_s"] = time.perf_counter() - t0
        done.set()

    writer = threading.Thread(target=drain)
    writer.start()
    rate = main_thread_rate(device, 0.0, done)
    writer.join()
    return {"rate": rate, **spent}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", choices=("cuda", "cpu"), default=default)
    p.add_argument("--gib", type=float, default=2.0, help="the drained snapshot's size")
    p.add_argument("--dir", default="/dev/shm", help="where the slot file goes (a tmpfs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the stand-in's "device" copies stay on the writer's thread
    nbytes = int(a.gib * (1 << 30))
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    path = os.path.join(a.dir, f"rtj-drain-interference-{os.getpid()}")
    try:
        dst = mapped_file(path, nbytes)
        ops = CUDA if device.type == "cuda" else HostOps()
        results: dict[str, Any] = {}
        for mib, threads, depth in CONFIGS:
            pipe = ChunkPipe(0, threads, chunk_bytes=mib << 20, depth=depth, ops=ops)
            pipe.allocate()
            one(device, pipe, src, dst)  # warm: the chunks' first use
            rel, drains = [], []
            for _ in range(a.rounds):
                alone = main_thread_rate(device, 1.0, None)
                r = one(device, pipe, src, dst)
                rel.append(r["rate"] / alone)
                drains.append(r["drain_s"])
            pipe.close()
            assert torch.equal(dst[: 1 << 20].to(device), src[: 1 << 20])
            key = f"{mib}MiB x{depth} {threads}thr"
            results[key] = {
                "main_rate_relative": [round(x, 3) for x in rel],
                "median_relative": round(statistics.median(rel), 3),
                "drain_s": [round(x, 3) for x in drains],
                "gb_per_s": round(nbytes / statistics.median(drains) / 1e9, 2),
            }
            print(
                f"chunks {key:16s}: main thread {results[key]['median_relative']:.3f} of its rate alone "
                f"({results[key]['main_rate_relative']}); drain {results[key]['drain_s']} s, "
                f"{results[key]['gb_per_s']} GB/s",
                flush=True,
            )
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    out = {"device": a.device, "gib": a.gib, "rounds": a.rounds, "results": results}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
