"""How long a SIGKILLed rank takes to die with memory-tier slots mapped, against none mapped.

A rank maps its memory tier's slot files (`snapshot_ring`: keep + 1 slots of the whole state, every
page present) for the life of the process. When the rank is killed the kernel tears the mappings
down before the process's files close, and the GPU driver frees the rank's device memory only when
its files close: NVRx's launcher waits for that memory before it starts the next rank (its "GPU 0
memory reclaimed" line). This forks a child that maps `--slots` tmpfs files of `--gb` each and makes
every page present (MADV_POPULATE_WRITE, as `populate` does), SIGKILLs it and times kill -> reaped;
then the same with the files present but not mapped. One JSON line.

    python bench/exit_teardown.py --gb 3 --slots 2 --dir /dev/shm
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import statistics
import tempfile
import time

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def kill_to_reaped(paths: list[str], size: int, mapped: bool) -> float:
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the "rank": map every slot, fault every page in, wait to be killed
        maps = []
        if mapped:
            for path in paths:
                fd = os.open(path, os.O_RDWR)
                m = mmap.mmap(fd, size)
                os.close(fd)
                m.madvise(MADV_POPULATE_WRITE)
                maps.append(m)
        os.write(ready_w, b"x")
        time.sleep(600)
        os._exit(0)
    os.read(ready_r, 1)
    os.close(ready_r)
    os.close(ready_w)
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=3.0, help="size of each slot file")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--dir", default="/dev/shm", help="a tmpfs")
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    size = int(a.gb * (1 << 30))
    paths = []
    try:
        for _ in range(a.slots):
            fd, path = tempfile.mkstemp(dir=a.dir, prefix="rtj-exit-")
            paths.append(path)
            os.posix_fallocate(fd, 0, size)
            os.close(fd)
        out: dict[str, object] = {"gb_per_slot": a.gb, "slots": a.slots, "runs": a.runs}
        for mapped in (True, False):
            took = [kill_to_reaped(paths, size, mapped) for _ in range(a.runs)]
            key = "mapped" if mapped else "not_mapped"
            out[f"{key}_s"] = [round(x, 3) for x in took]
            out[f"{key}_median_s"] = round(statistics.median(took), 3)
        out["mapped_s_per_gb"] = round(out["mapped_median_s"] / (a.gb * a.slots * 1.073741824), 4)  # type: ignore[operator]
    finally:
        for path in paths:
            os.unlink(path)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
