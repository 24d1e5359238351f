"""How soon a job's first memory snapshot can be taken: the memory tier's `prepare` of a state of
`--gb`, seconds until the first slot is ready (the first snapshot waits for that alone) and until all
keep + 1 are, on the product's path (`SnapshotRing.prepare`: the slots side by side, each reserved
piece by piece while other threads make the reserved pieces present, counted ready in the order
claims take them), in the rank and through the pod's slot copier. Baseline, measured in the same
run: every slot at once, one thread per file reserving it whole and then making its pages present
(what `prepare` did before, written out here), when no snapshot could be taken before all were done.

    PYTHONPATH=trainer-image:operator python bench/slot_prepare.py --gb 2 --runs 3
    python3 bench/slot_prepare.py --gb 13.7 --runs 2          # a GPU host (bench/gpu_env.sh)

One JSON line: per row, the median of `--runs` of first-ready and all-ready seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint.snapshot_ring import POPULATE_CHUNK_BYTES, PREPARE_THREADS, SnapshotRing, layout
from rtj_trainer.slot_copier import CopierProcess, populate_pages, socket_path


def _ring(root: str) -> tuple[CheckpointManager, SnapshotRing]:
    mgr = CheckpointManager(
        os.path.join(root, "persist"), rank=0, world_size=1, interval_steps=1000,
        local_root=os.path.join(root, "shm"), local_interval_steps=10, local_keep=2,
    )  # fmt: skip
    assert mgr._p.ring is not None
    return mgr, mgr._p.ring


def product(root: str, size: int, drained: bool) -> tuple[float, float]:
    """(first slot ready, all ready) seconds of the product's prepare."""
    mgr, ring = _ring(root)
    specs = [torch.empty(size, dtype=torch.uint8, device="meta")]
    ring.expect()
    t0 = time.perf_counter()
    th = threading.Thread(target=ring.prepare, args=(specs, [False], drained))
    th.start()
    first = None
    while th.is_alive():
        if first is None and ring.next_slot_ready():
            first = time.perf_counter() - t0
        time.sleep(0.001)
    total = time.perf_counter() - t0
    mgr.close()
    ring.close()
    return (first if first is not None else total), total


def baseline(root: str, size: int) -> tuple[float, float]:
    """Every slot at once, one thread per file: reserved whole, then its pages made present."""
    mgr, ring = _ring(root)
    size = layout([torch.empty(size, dtype=torch.uint8, device="meta")])[1]
    files = ring._tier.ring_files(size)
    maps: list[torch.Tensor] = []

    def one(path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            whole = torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
            populate_pages(whole.data_ptr(), size, POPULATE_CHUNK_BYTES)
            maps.append(whole)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(files)) as pool:
        list(pool.map(one, files))
    total = time.perf_counter() - t0
    maps.clear()
    mgr.close()
    return total, total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=2.0, help="the state's size (decimal GB)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default="/dev/shm", help="a tmpfs, as the pod's memory volume")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    size = int(a.gb * 1e9)
    rows: dict[str, list[tuple[float, float]]] = {"baseline": [], "rank": [], "copier": []}
    for _ in range(a.runs):
        for row in rows:  # alternating, so drift on the machine falls on every row alike
            root = tempfile.mkdtemp(prefix="rtj-sp-", dir=a.dir)
            copier = (
                CopierProcess(socket_path(os.path.join(root, "shm"))).start() if row == "copier" else None
            )
            try:
                if row == "baseline":
                    rows[row].append(baseline(root, size))
                else:
                    rows[row].append(product(root, size, drained=row == "copier"))
            finally:
                if copier is not None:
                    copier.close()
                shutil.rmtree(root, ignore_errors=True)
    result: dict[str, Any] = {
        "gb": a.gb,
        "runs": a.runs,
        "cpus": os.cpu_count(),
        "prepare_threads": PREPARE_THREADS,
    }
    for row, vals in rows.items():
        result[row] = {
            "first_ready_s": round(statistics.median(v[0] for v in vals), 3),
            "all_ready_s": round(statistics.median(v[1] for v in vals), 3),
            "each": [[round(f, 3), round(t, 3)] for f, t in vals],
        }
    base = result["baseline"]["first_ready_s"]
    for row in ("rank", "copier"):
        result[row]["first_ready_vs_baseline"] = round(result[row]["first_ready_s"] / base, 3)
    line = json.dumps(result)
    print(line)
    if a.out:
        with open(a.out, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
