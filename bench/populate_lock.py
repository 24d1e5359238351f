"""What populating a memory-tier slot costs the rest of the process: while `snapshot_ring.populate`
makes a fresh tmpfs file's pages present (in `prepare`'s background thread), another thread maps
and unmaps 2 MiB of anonymous memory every 2 ms, as training's allocations do; its longest wait is
what a training step could stall for. Rows: one madvise over the whole file, then the product's
chunks (`POPULATE_CHUNK_BYTES`), each on a file of its own. One JSON line.

    PYTHONPATH=trainer-image python bench/populate_lock.py --gb 3 --dir /dev/shm
"""

from __future__ import annotations

import argparse
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial

import torch
from rtj_trainer.checkpoint.snapshot_ring import POPULATE_CHUNK_BYTES, populate
from snapshot_paths import save  # bench/, beside this script


def beside_probe[T](work: Callable[[], T]) -> tuple[T, float, float, int]:
    """(`work()`'s result, its seconds, the longest wait of another thread mapping, touching and
    unmapping 2 MiB every 2 ms meanwhile, how many times it did)."""
    stop, started, waits = threading.Event(), threading.Event(), [0.0]

    def probe() -> None:
        started.set()
        while not stop.is_set():
            t0 = time.perf_counter()
            m = mmap.mmap(-1, 2 << 20)
            m[0] = 1
            m.close()
            waits.append(time.perf_counter() - t0)
            time.sleep(0.002)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    started.wait()
    t0 = time.perf_counter()
    try:
        result = work()
    finally:
        seconds = time.perf_counter() - t0
        stop.set()
        prober.join()
    return result, seconds, max(waits), len(waits) - 1


def probe_beside_populate(size: int, directory: str, chunk_bytes: int) -> dict[str, float]:
    fd, path = tempfile.mkstemp(dir=directory, prefix="rtj-populate-")
    try:
        os.posix_fallocate(fd, 0, size)
        os.close(fd)
        mapped = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
        _, seconds, max_wait, probes = beside_probe(partial(populate, mapped, chunk_bytes))
        del mapped
    finally:
        os.unlink(path)
    return {"populate_s": seconds, "probe_max_wait_s": max_wait, "probes": probes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=3.0, help="size of each slot file")
    p.add_argument("--dir", default="/dev/shm", help="a tmpfs")
    p.add_argument("--out", help="also write the JSON line here")
    a = p.parse_args()
    size = int(a.gb * 1e9) // mmap.PAGESIZE * mmap.PAGESIZE
    out: dict[str, object] = {"gb": a.gb, "chunk_bytes": POPULATE_CHUNK_BYTES}
    for name, chunk in (("one_call", size), ("chunked", POPULATE_CHUNK_BYTES)):
        for k, v in probe_beside_populate(size, a.dir, chunk).items():
            out[f"{name}_{k}"] = round(v, 4) if isinstance(v, float) else v
    print(save(out, a.out))  # one JSON line, also into --out


if __name__ == "__main__":
    main()
