"""The persisted copy of one rank's memory-tier shard, and the process that makes it off the rank.

Torch-free (a child process imports it alone). `copy_shard` reads the committed snapshot with
pread, checksums it and writes it into a partial under the checkpoint root. A rank does not run it
in a thread of its own: `copy_shard_in_child` starts `python -m rtj_trainer.checkpoint_copy` for
each persist and waits for its result. A persist of the 1.14 B-parameter example's 13.7 GB runs
for 12-15 s, most of the time when a persist is due every 40 steps, and in a thread of the rank
its reads, checksums and writes went through the rank's GIL between every piece, beside the
training thread (`bench/drain_interference.py --persist`: on the 2-core machine the training
thread kept 0.769 of its rate beside a persist in a thread, 0.862 beside one in a child process,
bench/results/drain_interference_cpu_2026-12-07/).
The child dies with the thread that started it (PR_SET_PDEATHSIG), so a SIGKILLed rank leaves no
writer behind; an abort (`WriteControl.abort`) kills it.

The pod's entrypoint finishing an emergency persist (`checkpoint.handoff`) calls `copy_shard`
itself: no training runs beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .checkpoint_format import (
    CHUNK_BYTES,
    CheckpointError,
    crc32_of,
    read_local_meta,
    shard_bin,
    shard_idx,
    write_file_atomic,
)
from .pids import die_with_parent

MODULE = "rtj_trainer.checkpoint_copy"
#: Seconds between looks at the abort flag while a child copies (an abort ends the copy within this;
#: the in-thread copy looked once per 64 MiB piece, tens of milliseconds).
ABORT_POLL_S = 0.05

FileSums = dict[str, dict[str, Any]]

#: Threads writing the persisted copy of a memory snapshot (`copy_shard`). One thread reading into
#: new buffers, writing and checksumming in turn persisted 13.7 GB at 0.6-0.7 GB/s on an H100 host
#: (19-24 s). `bench/persist_copy.py` times the copies: 3 GB from /dev/shm to the 2-core machine's
#: disk in 2.8-3.7 s with 1 or 4 threads, 1.7-2.4 s mapped (the copy before, which stalled the
#: rank's other threads at its munmap), 9.8-10.3 s for the loop (2 runs). More than one is for
#: stores that want several writes in flight (FSx for Lustre, NVMe).
PERSIST_WRITE_THREADS = 4
#: The niceness the persist's child process adds to its own: its reads, checksums and writes yield
#: a core to the rank's training and drain threads where both want one. A background persist is
#: never urgent (an emergency one is the pod entrypoint's, `checkpoint.handoff`, at full priority).
#: On the 2-core machine the main thread kept 0.966 of its rate beside a 1 GiB persist niced, 0.896
#: beside one at its own priority, the persist no slower (2.7-3.0 s; bench/drain_interference.py
#: --persist, bench/results/persist_nice_cpu_2026-12-07/).
PERSIST_NICE = 10


class Aborted(Exception):
    """The write was asked to stop (`WriteControl.abort`); its partial files are dropped."""


@dataclass
class WriteControl:
    """Shared by every writer of one rank: the abort flag and an optional bandwidth throttle
    (`bytes_per_s`: tests and benchmarks of "storage slower than the interval")."""

    bytes_per_s: float | None = None
    abort: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if self.abort.is_set():
            raise Aborted

    def throttle(self, written: int, t_start: float) -> None:
        if not self.bytes_per_s:
            return
        ahead = written / self.bytes_per_s - (time.monotonic() - t_start)
        if ahead > 0 and self.abort.wait(ahead):
            raise Aborted


def copy_shard(
    src: str, partial: str, rank: int, control: WriteControl, threads: int = PERSIST_WRITE_THREADS
) -> FileSums:
    """Copy this rank's memory-tier shard `src` into a partial under root, computing its CRC32 on
    the way (the memory tier has no checksums: committed by rename, in RAM; the persisted copy does).
    This thread reads 64 MiB pieces in order into a few reused buffers and adds each to the CRC32
    while `threads` threads write the pieces read before (`_copy_pieces`)."""
    files = read_local_meta(src)["files"]
    bin_name, idx_name = shard_bin(rank), shard_idx(rank)
    size = int(files[bin_name]["size"])
    bin_path = os.path.join(partial, bin_name)
    tmp = f"{bin_path}.tmp"
    t_start = time.monotonic()
    fin = os.open(os.path.join(src, bin_name), os.O_RDONLY)
    try:
        if os.fstat(fin).st_size != size:
            raise CheckpointError(f"{src}: its files do not have the sizes it was committed with")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        try:
            os.ftruncate(fd, size)
            crc = _copy_pieces(fin, fd, size, threads, control, throttle_from=t_start)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        os.close(fin)
    with open(os.path.join(src, idx_name), "rb") as f:
        idx = f.read()
    if len(idx) != files[idx_name]["size"]:
        raise CheckpointError(f"{src}: its files do not have the sizes it was committed with")
    os.replace(tmp, bin_path)
    write_file_atomic(os.path.join(partial, idx_name), idx)
    return {
        bin_name: {"size": size, "crc32": crc},
        idx_name: {"size": len(idx), "crc32": crc32_of(idx)},
    }


def _copy_pieces(
    fin: int, fd: int, size: int, threads: int, control: WriteControl, *, throttle_from: float
) -> int:
    """Copy `size` bytes of `fin` to `fd` in CHUNK_BYTES pieces; the CRC32 of the bytes.

    Read with pread, never mapped: a mapping of the snapshot in this process would take the rank's
    mmap lock for every page it faults in and, at its munmap, for as long as unmapping 13.7 GB takes
    (tenths of a second), and any thread of the rank that maps memory meanwhile (the training
    thread's allocations) waits. `threads` + 1 buffers are reused: this thread reads a piece and adds
    it to the CRC32 while the writers write the pieces before it; every call here releases the GIL."""
    threads = max(1, min(threads, -(-size // CHUNK_BYTES)))
    free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
    for _ in range(threads + 1):
        free.put(bytearray(CHUNK_BYTES))
    lock, written, crc = threading.Lock(), 0, 0
    errors: list[BaseException] = []

    def write(buf: bytearray, at: int, n: int) -> None:
        nonlocal written
        try:
            control.check()
            _pwrite_all(fd, memoryview(buf)[:n], at)
            with lock:
                written += n
                total = written
            control.throttle(total, throttle_from)
        except BaseException as e:
            errors.append(e)  # the reader stops at its next piece
            raise
        finally:
            free.put(buf)

    futures = []
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="rtj-ckpt-pwrite") as pool:
        try:
            for at in range(0, size, CHUNK_BYTES):
                control.check()
                buf = free.get()
                if errors:
                    raise errors[0]
                n = _pread_full(fin, buf, at, min(CHUNK_BYTES, size - at))
                crc = crc32_of(memoryview(buf)[:n], crc)
                futures.append(pool.submit(write, buf, at, n))
            for f in futures:
                f.result()
        finally:
            for f in futures:
                f.cancel()  # those not begun; the running ones end before the pool's exit
    return crc


def _pwrite_all(fd: int, chunk: memoryview, at: int) -> None:
    done = 0
    while done < len(chunk):
        done += os.pwrite(fd, chunk[done:], at + done)


def _pread_full(fin: int, buf: bytearray, at: int, n: int) -> int:
    view, got = memoryview(buf), 0
    while got < n:
        k = os.preadv(fin, [view[got:n]], at + got)
        if k == 0:
            raise CheckpointError(f"the snapshot ended at byte {at + got}, {n - got} short")
        got += k
    return got


def copy_shard_in_child(
    src: str,
    partial: str,
    rank: int,
    control: WriteControl,
    threads: int = PERSIST_WRITE_THREADS,
    nice: int = PERSIST_NICE,
) -> FileSums:
    """`copy_shard` in a child process (`python -m rtj_trainer.checkpoint_copy`) running `nice`
    steps nicer than the rank: the same files and sums, the same errors (an OSError keeps its
    errno: a full store stays CHECKPOINT_STORAGE_FULL). An abort kills the child and raises Aborted
    once it is gone."""
    cmd = [sys.executable, "-m", MODULE, src, partial, str(rank), "--threads", str(threads)]
    cmd += ["--parent", str(os.getpid()), "--nice", str(nice)]
    if control.bytes_per_s:
        cmd += ["--bytes-per-s", str(control.bytes_per_s)]
    control.check()
    # The child imports this package from where the rank did, whatever put it on the rank's path.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    while True:
        try:
            out, err = proc.communicate(timeout=ABORT_POLL_S)
            break
        except subprocess.TimeoutExpired:
            if control.abort.is_set():
                proc.kill()
                proc.communicate()
                raise Aborted from None
    lines = out.decode(errors="replace").strip().splitlines()
    reply: dict[str, Any] = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if proc.returncode == 0 and "files" in reply:
        files: FileSums = reply["files"]
        return files
    if "error" not in reply:
        tail = err.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"the persist's copy process exited {proc.returncode}: {tail}")
    if reply.get("errno") is not None:
        raise OSError(reply["errno"], reply["error"])
    if reply.get("type") == "CheckpointError":
        raise CheckpointError(reply["error"])
    raise RuntimeError(reply["error"])


def main(argv: list[str] | None = None) -> None:
    """`python -m rtj_trainer.checkpoint_copy SRC PARTIAL RANK`: `copy_shard`, then one JSON line on
    stdout: {"files": sums}, or {"error", "errno", "type"} and exit status 1."""
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    p.add_argument("src")
    p.add_argument("partial")
    p.add_argument("rank", type=int)
    p.add_argument("--threads", type=int, default=PERSIST_WRITE_THREADS)
    p.add_argument("--bytes-per-s", type=float, default=None)
    p.add_argument("--parent", type=int, default=None, help="exit at once unless this is still the parent")
    p.add_argument("--nice", type=int, default=0, help="add this to the process's niceness first")
    a = p.parse_args(argv)
    if not die_with_parent(signal.SIGKILL, a.parent):
        sys.exit(1)
    if a.nice:
        os.nice(a.nice)  # every thread the copy starts inherits it
    try:
        files = copy_shard(a.src, a.partial, a.rank, WriteControl(a.bytes_per_s), threads=a.threads)
    except Exception as e:
        errno_ = e.errno if isinstance(e, OSError) else None
        print(json.dumps({"error": str(e), "errno": errno_, "type": type(e).__name__}), flush=True)
        sys.exit(1)
    print(json.dumps({"files": files}), flush=True)


if __name__ == "__main__":
    main()
