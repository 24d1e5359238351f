"""The persisted copy of a memory snapshot (`shard_io.copy_shard`) against the loop it replaced, in
the same run: a memory-tier shard of `--gb` in `--src` (a tmpfs) copied into `--dst` (the persisted
tier's disk), fsync included. Rows:

- `loop_s`: one thread reading 64 MiB into a new buffer, writing it and adding it to the CRC32 in
  turn (the copy before 2026-12-06);
- `mapped_4t_s`: 4 threads writing from the snapshot mapped into the process while the calling
  thread computes the CRC32 over the mapping (the copy from 2026-12-06 until `copy_shard` read the
  snapshot instead);
- `copy_<n>t_s`: `copy_shard` with n writer threads (the snapshot read into reused buffers, the
  CRC32 computed meanwhile);
- `crc_alone_s`: the CRC32 of the mapped bytes, nothing else.

Beside each copy another thread maps and unmaps 2 MiB every 2 ms (as training's allocations do):
`<row>_probe_max_wait_s` is its longest wait, what a training step could stall for while the copy
holds the process's mmap lock (faulting in the mapping, unmapping it). Each copy is checked
against the source's CRC32. One JSON line.

    PYTHONPATH=trainer-image python bench/persist_copy.py --gb 2 --src /dev/shm --dst /tmp
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from populate_lock import beside_probe  # bench/, beside this script
from rtj_trainer.checkpoint.shard_io import WriteControl, copy_shard, write_shard
from rtj_trainer.checkpoint_format import CHUNK_BYTES, shard_bin, write_local_meta
from snapshot_paths import save


def make_snapshot(root: str, nbytes: int) -> str:
    src = os.path.join(root, "step-1")
    os.makedirs(src)
    data = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    files = write_shard(
        src, 0, [data], {"state": ["x"], "extra": {}}, WriteControl(), throttle=False, checksum=False
    )
    meta = {"step": 1, "nonce": 1, "worldSize": 1, "rank": 0, "time": "2026-12-06T00:00:00Z", "files": files}
    write_local_meta(src, meta)
    return src


def previous_loop(src: str, dst: str) -> int:
    crc = 0
    with open(os.path.join(src, shard_bin(0)), "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as f:
        while chunk := fin.read(CHUNK_BYTES):
            view = memoryview(chunk)
            written = 0
            while written < len(view):
                written += f.write(view[written:])
            crc = zlib.crc32(view, crc)
        os.fsync(f.fileno())
    return crc


def previous_mapped(src: str, dst: str, threads: int = 4) -> int:
    """The snapshot mapped, `threads` threads writing its pieces, this thread's CRC32 meanwhile."""
    with open(os.path.join(src, shard_bin(0)), "rb") as fin:
        size = os.fstat(fin.fileno()).st_size
        mapped = mmap.mmap(fin.fileno(), size, prot=mmap.PROT_READ)
    view = memoryview(mapped)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    crc = 0

    def write(at: int) -> None:
        piece, done = view[at : at + CHUNK_BYTES], 0
        while done < len(piece):
            done += os.pwrite(fd, piece[done:], at + done)
        piece.release()

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(write, at) for at in range(0, size, CHUNK_BYTES)]
        for at in range(0, size, CHUNK_BYTES):
            with view[at : at + CHUNK_BYTES] as piece:
                crc = zlib.crc32(piece, crc)
        for f in futures:
            f.result()
    os.fsync(fd)
    os.close(fd)
    view.release()
    mapped.close()
    return crc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--src", default="/dev/shm", help="a tmpfs: where the memory tier lives")
    p.add_argument("--dst", default="/tmp", help="the persisted tier's disk")
    p.add_argument("--threads", default="1,2,4,8")
    p.add_argument("--no-loop", action="store_true", help="leave out the loop's row (the slowest)")
    p.add_argument("--out", help="also write the JSON line here")
    a = p.parse_args()
    src_root = tempfile.mkdtemp(prefix="rtj-persist-src-", dir=a.src)
    dst_root = tempfile.mkdtemp(prefix="rtj-persist-dst-", dir=a.dst)
    out: dict[str, object] = {"gb": a.gb}
    try:
        src = make_snapshot(src_root, int(a.gb * 1e9))
        with open(os.path.join(src, shard_bin(0)), "rb") as f:
            m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        t0 = time.perf_counter()
        want = zlib.crc32(m)
        out["crc_alone_s"] = time.perf_counter() - t0
        m.close()
        if not a.no_loop:
            got, out["loop_s"], out["loop_probe_max_wait_s"], _ = beside_probe(
                lambda: previous_loop(src, os.path.join(dst_root, "loop.bin"))
            )
            assert got == want
            os.unlink(os.path.join(dst_root, "loop.bin"))
        got, out["mapped_4t_s"], out["mapped_4t_probe_max_wait_s"], _ = beside_probe(
            lambda: previous_mapped(src, os.path.join(dst_root, "mapped.bin"))
        )
        assert got == want
        os.unlink(os.path.join(dst_root, "mapped.bin"))
        for n in [int(x) for x in a.threads.split(",")]:
            partial = os.path.join(dst_root, f"partial-{n}")
            os.makedirs(partial)
            files, out[f"copy_{n}t_s"], out[f"copy_{n}t_probe_max_wait_s"], _ = beside_probe(
                lambda: copy_shard(src, partial, 0, WriteControl(), threads=n)  # noqa: B023
            )
            assert files[shard_bin(0)]["crc32"] == want
            shutil.rmtree(partial)
    finally:
        shutil.rmtree(src_root, ignore_errors=True)
        shutil.rmtree(dst_root, ignore_errors=True)
    print(save(out, a.out))  # one JSON line, also into --out


if __name__ == "__main__":
    main()
