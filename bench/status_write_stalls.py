"""How long a rank's status-file writes stall while a persist writes to the same disk, with the
status directory on that disk or in memory.

A rank rewrites its status file (`report.write_atomic`: a temporary file and a rename) from its
training thread every 0.5 s, and a script often appends a step log line per step. This times such
writes, every 20 ms in a thread, while the product's persisted copy (`shard_io.copy_shard`) copies
a `--gib` GiB memory-tier snapshot from `--src` (a tmpfs) into `--dst` (a disk), with the status
directory under each of `--status` in turn, alternating, `--runs` times. Per persist: the longest
write, and the sum of the writes over 10 ms.

    PYTHONPATH=trainer-image:operator python bench/status_write_stalls.py --gib 2 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time

import torch
from rtj_trainer.checkpoint.shard_io import WriteControl, copy_shard, write_shard
from rtj_trainer.checkpoint_format import write_local_meta
from rtj_trainer.report import write_atomic

WRITE_EVERY_S = 0.02


def snapshot(src_dir: str, gib: float) -> str:
    """A memory-tier snapshot of `gib` GiB (one rank's files), as the persist reads it."""
    src = os.path.join(tempfile.mkdtemp(prefix="rtj-sws-src-", dir=src_dir), "step-1")
    os.makedirs(src)
    data = torch.randint(0, 256, (int(gib * (1 << 30)),), dtype=torch.uint8)
    files = write_shard(
        src, 0, [data], {"state": ["x"], "extra": {}}, WriteControl(), throttle=False, checksum=False
    )
    write_local_meta(src, {"step": 1, "nonce": 1, "worldSize": 1, "rank": 0, "time": "-", "files": files})
    return src


def beside_a_persist(src: str, dst_dir: str, status_base: str) -> dict[str, float]:
    status = tempfile.mkdtemp(prefix="rtj-sws-status-", dir=status_base)
    partial = tempfile.mkdtemp(prefix="rtj-sws-dst-", dir=dst_dir)
    seconds: list[float] = []
    done = threading.Event()

    def writer() -> None:
        n = 0
        while not done.is_set():
            t0 = time.perf_counter()
            write_atomic(os.path.join(status, "rank-0.json"), json.dumps({"step": n}))
            with open(os.path.join(status, "steps.jsonl"), "a") as f:
                f.write(json.dumps({"step": n}) + "\n")
            seconds.append(time.perf_counter() - t0)
            n += 1
            time.sleep(WRITE_EVERY_S)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        t0 = time.perf_counter()
        copy_shard(src, partial, 0, WriteControl())
        persist = time.perf_counter() - t0
    finally:
        done.set()
        thread.join()
        shutil.rmtree(partial, ignore_errors=True)
        shutil.rmtree(status, ignore_errors=True)
    return {
        "persist_s": round(persist, 2),
        "writes": len(seconds),
        "longest_s": round(max(seconds), 3),
        "over_10ms_sum_s": round(sum(s for s in seconds if s > 0.01), 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--src", default="/dev/shm", help="the memory tier (a tmpfs)")
    p.add_argument("--dst", default="/tmp", help="the persisted tier (a disk)")
    p.add_argument("--status", default="/tmp,/dev/shm", help="status directory bases, alternated")
    a = p.parse_args()
    src = snapshot(a.src, a.gib)
    bases = a.status.split(",")
    rows: dict[str, list[dict[str, float]]] = {b: [] for b in bases}
    try:
        for _ in range(a.runs):
            for base in bases:
                rows[base].append(beside_a_persist(src, a.dst, base))
                time.sleep(2)  # the disk's writeback of one persist before the next
    finally:
        shutil.rmtree(os.path.dirname(src), ignore_errors=True)
    for base, runs in rows.items():
        longest = [r["longest_s"] for r in runs]
        over = [r["over_10ms_sum_s"] for r in runs]
        persist = [r["persist_s"] for r in runs]
        print(f"status in {base:9s}: longest {longest} s, over 10 ms {over} s, persist {persist} s")
    print(json.dumps({"gib": a.gib, "runs": a.runs, "cpus": os.cpu_count(), "rows": rows}))


if __name__ == "__main__":
    main()
