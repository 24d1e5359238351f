"""How much a memory snapshot's drain takes from the training thread, by chunk size and copy threads.

The drain (`device_stage.ChunkPipe.to_host`, the product's code) runs in the writer thread while
training goes on in the main thread. Every chunk costs the writer a few round trips through the GIL
(waiting for the chunk's event, its host copy, the next chunk's copy call), and each may hold up the
main thread's next torch call, whose launches are a step's CPU side. This times, for each
(chunk MiB, threads, ring depth), the main thread issuing small torch ops while one drain of `--gib` GiB
runs into a file in `--dir` (a tmpfs: the memory tier), against the same ops with no drain, in
alternation, `--rounds` times. The last row has the pod's slot copier (`rtj_trainer.slot_copier`, a
process of its own) copy each chunk into the file, as a rank's drain does when its pod runs one.

On a GPU the drained buffer and the main thread's ops are on the GPU (`--device cuda`) and the pipe
uses CUDA streams and pinned chunks, as in a rank; on the CPU (`--device cpu`) a synchronous
stand-in copies the "device" bytes (tests/trainer_ckpt/host_device.py's way), with torch on one
thread.

    PYTHONPATH=trainer-image python bench/drain_interference.py --device cuda --gib 13 --out F

`--persist DIR` adds the persist's cost: the persisted copy (`checkpoint_copy.copy_shard`, a
memory-tier snapshot of `--gib` into a partial under DIR, the persisted tier's disk) run in a thread
of this process, as a rank persisted until 2026-12-07, in a child process started by a thread of
this process (`copy_shard_in_child`) at the rank's priority, and in one PERSIST_NICE steps nicer
(the rank's path), each beside the same small ops, alternating with the ops alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rtj_trainer.checkpoint.device_stage import CUDA, ChunkPipe, CudaOps
from rtj_trainer.slot_copier import CopierClient, CopierProcess, socket_path

#: (chunk MiB, copy threads, chunks in the ring, by the pod's slot copier): the defaults before and
#: now, around them, and the defaults with the copier doing the host copies in its own process.
CONFIGS = (
    (64, 4, 4, False),
    (64, 1, 4, False),
    (256, 1, 2, False),
    (256, 1, 4, False),
    (256, 2, 2, False),
    (512, 1, 2, False),
    (256, 1, 2, True),
)


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

    def register(self, t: torch.Tensor) -> None: ...

    def unregister(self, t: torch.Tensor) -> None: ...


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


def one(
    device: torch.device, pipe: ChunkPipe, src: torch.Tensor, dst: torch.Tensor, dst_fd: int | None = None
) -> dict[str, float]:
    done = threading.Event()
    spent: dict[str, float] = {}

    def drain() -> None:
        t0 = time.perf_counter()
        event = pipe.to_host(src, dst, dst_fd=dst_fd)
        if device.type == "cuda":
            event.synchronize()
        spent["drain_s"] = time.perf_counter() - t0
        done.set()

    writer = threading.Thread(target=drain)
    writer.start()
    rate = main_thread_rate(device, 0.0, done)
    writer.join()
    return {"rate": rate, **spent}


def alternate(
    device: torch.device, rounds: int, beside: Callable[[], dict[str, float]], seconds: str
) -> dict[str, Any]:
    """`rounds` times: the main thread's rate alone for a second, then beside `beside()` (which
    returns that rate and `seconds`); the ratios and the seconds."""
    rel, took = [], []
    for _ in range(rounds):
        alone = main_thread_rate(device, 1.0, None)
        r = beside()
        rel.append(r["rate"] / alone)
        took.append(r[seconds])
    return {
        "main_rate_relative": [round(x, 3) for x in rel],
        "median_relative": round(statistics.median(rel), 3),
        seconds: [round(x, 3) for x in took],
    }


#: Where the persist runs: in a thread of this process, in a child at the rank's priority, and in a
#: child PERSIST_NICE steps nicer (the rank's path).
PERSIST_PLACES = ("thread", "process", "niced process")


def persist_once(src: str, dst_root: str, where: str) -> float:
    """The persisted copy of the snapshot `src` into a new partial under `dst_root` (`where`: one
    of PERSIST_PLACES)."""
    from rtj_trainer.checkpoint.shard_io import WriteControl, copy_shard, copy_shard_in_child
    from rtj_trainer.checkpoint_copy import PERSIST_NICE

    partial = tempfile.mkdtemp(prefix="step.partial-", dir=dst_root)
    try:
        t0 = time.perf_counter()
        if where == "thread":
            copy_shard(src, partial, 0, WriteControl())
        else:
            nice = PERSIST_NICE if where == "niced process" else 0
            copy_shard_in_child(src, partial, 0, WriteControl(), nice=nice)
        return time.perf_counter() - t0  # the child's start included
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def persist_beside(device: torch.device, src: str, dst_root: str, where: str) -> dict[str, float]:
    """The main thread's rate while one persist runs where `where` says."""
    done = threading.Event()
    spent: dict[str, float] = {}

    def persist() -> None:
        spent["persist_s"] = persist_once(src, dst_root, where)
        done.set()

    worker = threading.Thread(target=persist)
    worker.start()
    rate = main_thread_rate(device, 0.0, done)
    worker.join()
    return {"rate": rate, **spent}


def persist_rows(device: torch.device, gib: float, src_dir: str, dst_dir: str, rounds: int) -> dict[str, Any]:
    from rtj_trainer.checkpoint.shard_io import WriteControl, write_shard
    from rtj_trainer.checkpoint_format import write_local_meta

    src_root = tempfile.mkdtemp(prefix="rtj-drain-interference-src-", dir=src_dir)
    dst_root = tempfile.mkdtemp(prefix="rtj-drain-interference-dst-", dir=dst_dir)
    rows: dict[str, Any] = {}
    try:
        src = os.path.join(src_root, "step-1")
        os.makedirs(src)
        data = torch.randint(0, 256, (int(gib * (1 << 30)),), dtype=torch.uint8)
        files = write_shard(
            src, 0, [data], {"state": ["x"], "extra": {}}, WriteControl(), throttle=False, checksum=False
        )
        del data
        meta = {
            "step": 1,
            "nonce": 1,
            "worldSize": 1,
            "rank": 0,
            "time": "2026-12-06T00:00:00Z",
            "files": files,
        }
        write_local_meta(src, meta)
        for where in PERSIST_PLACES:
            row = alternate(
                device, rounds, partial(persist_beside, device, src, dst_root, where), "persist_s"
            )
            rows[f"persist in a {where}"] = row
            print(
                f"persist in a {where:13s}: main thread {row['median_relative']:.3f} of its rate alone "
                f"({row['main_rate_relative']}); persist {row['persist_s']} s",
                flush=True,
            )
    finally:
        shutil.rmtree(src_root, ignore_errors=True)
        shutil.rmtree(dst_root, ignore_errors=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    default = "cuda" if torch.cuda.is_available() else "cpu"
    p.add_argument("--device", choices=("cuda", "cpu"), default=default)
    p.add_argument("--gib", type=float, default=2.0, help="the drained snapshot's size")
    p.add_argument("--dir", default="/dev/shm", help="where the slot file goes (a tmpfs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--persist", default=None, help="also time a persist into this directory (a disk)")
    p.add_argument("--no-drain", action="store_true", help="only the persist rows")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device(a.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # the stand-in's "device" copies stay on the writer's thread
    results: dict[str, Any] = {}
    if not a.no_drain:
        results.update(drain_rows(device, a.gib, a.dir, a.rounds))
    if a.persist:
        results.update(persist_rows(device, a.gib, a.dir, a.persist, a.rounds))
    out = {"device": a.device, "gib": a.gib, "rounds": a.rounds, "results": results}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


def drain_rows(device: torch.device, gib: float, slot_dir: str, rounds: int) -> dict[str, Any]:
    nbytes = int(gib * (1 << 30))
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    path = os.path.join(slot_dir, f"rtj-drain-interference-{os.getpid()}")
    results: dict[str, Any] = {}
    try:
        dst = mapped_file(path, nbytes)
        ops = CUDA if device.type == "cuda" else HostOps()
        for mib, threads, depth, by_copier in CONFIGS:
            copier_or_none = (
                _slot_copier(slot_dir, path) if by_copier else contextlib.nullcontext((None, None))
            )
            with copier_or_none as (copier, dst_fd):
                pipe = ChunkPipe(0, threads, chunk_bytes=mib << 20, depth=depth, ops=ops, copier=copier)
                pipe.allocate()
                assert (pipe.copier is not None) == by_copier, "the copier refused the chunks"
                dst.zero_()
                one(device, pipe, src, dst, dst_fd)  # warm: the chunks' first use
                row = alternate(device, rounds, partial(one, device, pipe, src, dst, dst_fd), "drain_s")
                assert (pipe.copier is not None) == by_copier, "the copier failed: the rank copied"
                pipe.close()
            assert torch.equal(dst[: 1 << 20].to(device), src[: 1 << 20])
            assert torch.equal(dst[-(1 << 20) :].to(device), src[-(1 << 20) :])
            key = f"{mib}MiB x{depth} {threads}thr" + (" copier" if by_copier else "")
            results[key] = row = {
                **row,
                "gb_per_s": round(nbytes / statistics.median(row["drain_s"]) / 1e9, 2),
            }
            print(
                f"chunks {key:16s}: main thread {row['median_relative']:.3f} of its rate alone "
                f"({row['main_rate_relative']}); drain {row['drain_s']} s, {row['gb_per_s']} GB/s",
                flush=True,
            )
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    return results


@contextlib.contextmanager
def _slot_copier(slot_dir: str, path: str) -> Iterator[tuple[CopierClient, int]]:
    """The pod's slot copier (`python -m rtj_trainer.slot_copier`, as the entrypoint runs it),
    a client of it and the slot file's descriptor for its requests."""
    sock_dir = tempfile.mkdtemp(prefix="rtj-di-", dir=slot_dir)
    copier = CopierProcess(socket_path(sock_dir)).start()
    fd = os.open(path, os.O_RDWR)
    try:
        client = CopierClient.connect(socket_path(sock_dir))
        assert client is not None, "no slot copier to connect to"
        yield client, fd
    finally:
        os.close(fd)
        copier.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
