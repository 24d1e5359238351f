"""Memory-tier snapshot write time vs the number of write threads (issue 14, "snapshots that are never
skipped"): how long rtj_trainer.checkpoint takes to copy one rank's state from its pinned host
buffer into the memory tier (tmpfs), with 1..N threads, in the same run; the ratio is against 1
thread. A snapshot due while the previous one is still being written waits for it (it is taken at
the first step after), so the write time bounds the shortest memory-snapshot interval that is never
late: interval >= write seconds / step seconds.

    python bench/snapshot_write_threads.py                       # CPU: 1 GB of fp32 state
    python bench/snapshot_write_threads.py --device cuda --gb 6.85 --threads 1,2,4,8,16   # GPU node

Prints a table and writes JSON (--out). The state is split into tensors of --tensor-mb (the FSDP2
model of the GPU runs has 660 tensors, 10 MB each on average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any

import torch
from rtj_trainer.checkpoint import CheckpointEvent, CheckpointManager


class State(torch.nn.Module):
    def __init__(self, total_bytes: int, tensor_bytes: int, device: str) -> None:
        super().__init__()
        n, left = 0, total_bytes
        while left > 0:
            size = min(tensor_bytes, left)
            self.register_buffer(f"t{n}", torch.full((size // 4,), float(n), device=device))
            left -= size
            n += 1


def measure(state: State, root: str, threads: int, reps: int) -> dict[str, Any]:
    events: list[CheckpointEvent] = []
    shutil.rmtree(root, ignore_errors=True)
    mgr = CheckpointManager(
        os.path.join(root, "persist"),
        rank=0,
        world_size=1,
        interval_steps=10**9,  # memory tier only
        local_root=os.path.join(root, "shm"),
        local_interval_steps=1,
        local_write_threads=threads,
        on_event=events.append,
    )
    mgr.prepare(state)  # pinned buffers outside the timing, as fsdp_train does
    stalls = []
    for step in range(1, reps + 2):  # the first write allocates the tmpfs pages: not counted
        assert mgr.maybe_save(step, state) == "snapshot"
        stalls.append(mgr.last_snapshot_s)
        assert mgr.wait_local(timeout=600)
    mgr.close(timeout=60)
    writes = [e.seconds for e in events if e.kind == "snapshot" and e.seconds is not None][1:]
    shutil.rmtree(root, ignore_errors=True)
    return {
        "threads": threads,
        "write_s": writes,
        "median_write_s": round(statistics.median(writes), 4),
        "median_stall_s": round(statistics.median(stalls[1:]), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--gb", type=float, default=1.0, help="state per rank (GB)")
    p.add_argument("--tensor-mb", type=float, default=10.0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", default="1,2,4,8")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", default="/dev/shm", help="a tmpfs for the memory tier")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    total = int(a.gb * 1e9)
    state = State(total, int(a.tensor_mb * 1e6), a.device)
    root = tempfile.mkdtemp(prefix="rtj-snapshot-threads-", dir=a.dir)
    rows = [measure(state, root, int(t), a.reps) for t in a.threads.split(",")]
    shutil.rmtree(root, ignore_errors=True)
    base = rows[0]["median_write_s"]
    print(
        f"\n{total / 1e9:.2f} GB in {len(list(state.buffers()))} tensors, {a.device}, {os.cpu_count()} CPUs"
    )
    print("| threads | write s (median of reps) | GB/s | vs 1 thread | stall s |")
    print("|---|---|---|---|---|")
    for r in rows:
        r["gb_per_s"] = round(total / 1e9 / r["median_write_s"], 2)
        r["speedup"] = round(base / r["median_write_s"], 2)
        cells = [r["threads"], r["median_write_s"], r["gb_per_s"], f"{r['speedup']}x", r["median_stall_s"]]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "bytes": total,
        "device": a.device,
        "rows": rows,
    }
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
