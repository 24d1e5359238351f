"""A starting rank 0 beside the partial a killed persist left: how long its CheckpointManager takes
to construct, with the leftovers deleted in the background (the product) against deleted before the
constructor returns (what it did before, timed as the same deletion run inline).

A rank SIGKILLed while its persist child wrote leaves `step-N.<nonce>.partial/rank-0.bin` of the
whole shard, much of it still dirty in the page cache; the restarted rank 0 deletes it at its start.
On a GPU host (ext4, online discard) that deletion held a restarting rank 1.85 s on the disk.

    PYTHONPATH=trainer-image:operator python bench/stale_cleanup.py --gib 4 --dir /var/tmp/rtj-stale --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint.persistent import remove_all
from rtj_trainer.checkpoint_format import partial_name, shard_bin, stale_entries

CHUNK = 64 << 20


def leave_partial(root: str, gib: float, step: int) -> str:
    """A killed persist's partial: `gib` GiB written without fsync (dirty, as the child left it)."""
    partial = os.path.join(root, partial_name(step, 0xDEAD))
    os.makedirs(partial)
    buf = os.urandom(CHUNK)
    fd = os.open(os.path.join(partial, shard_bin(0)), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(int(gib * (1 << 30)) // CHUNK):
            os.write(fd, buf)
    finally:
        os.close(fd)
    return partial


def one(root: str, gib: float, inline: bool) -> dict[str, float]:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    partial = leave_partial(root, gib, 10)
    t0 = time.perf_counter()
    if inline:
        remove_all(stale_entries(root, None))
    mgr = CheckpointManager(root, rank=0, world_size=1, interval_steps=1_000_000)
    constructed = time.perf_counter() - t0
    mgr.wait(timeout=300)
    removed = time.perf_counter() - t0
    assert not os.path.exists(partial)
    return {"constructor_s": round(constructed, 4), "until_removed_s": round(removed, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--dir", default="/var/tmp/rtj-stale")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    rows: dict[str, list[dict[str, float]]] = {"background": [], "inline": []}
    for _ in range(a.runs):
        for mode in rows:  # alternating, so both see the same disk
            rows[mode].append(one(a.dir, a.gib, inline=mode == "inline"))
    shutil.rmtree(a.dir, ignore_errors=True)
    med = {m: statistics.median(r["constructor_s"] for r in rs) for m, rs in rows.items()}
    ratio = round(med["background"] / med["inline"], 4)
    out = {"gib": a.gib, "runs": rows, "constructor_median_s": med, "ratio_background_to_inline": ratio}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
