"""How fast a memory snapshot travels to the peer replica and back (`rtj_trainer.peer_replica`), next
to its floors measured in the same run. One JSON line.

    PYTHONPATH=trainer-image:operator python bench/replica_stream.py --gb 2 --dir /dev/shm

A snapshot of `--gb` GB is committed by a `CheckpointManager` in a memory tier under `--dir`; a
replica server runs in a process of its own (as in a pod); `put` is `send_snapshot` (what a rank's
replicator does after each snapshot, and an emergency save), `get` is `fetch_snapshot` (what a
replacement pod does). Floors: the same bytes sent over one loopback TCP connection from memory to
a reader that discards them, and zlib's CRC32 over them in one thread (the stream checks each file's
CRC32 on both ends). Each row is the median of `--runs`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import torch
from rtj_local.procs import free_port
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint_format import local_rank_dir, local_snapshots
from rtj_trainer.peer_replica import fetch_snapshot, list_held, send_snapshot

#: The replica server's (its own process); RTJ_BENCH_SERVER_PYTHONPATH runs another version of it.
PYTHONPATH = os.environ.get("RTJ_BENCH_SERVER_PYTHONPATH") or os.pathsep.join(
    str(Path(__file__).resolve().parents[1] / d) for d in ("trainer-image", "operator")
)
MiB = 1 << 20


def median_seconds(fn: object, runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def loopback_floor(data: memoryview, runs: int) -> float:
    """Seconds to send `data` over one loopback TCP connection to a reader that discards it."""

    def once() -> None:
        srv = socket.create_server(("127.0.0.1", 0))
        port = srv.getsockname()[1]

        def sink() -> None:
            conn, _ = srv.accept()
            buf = bytearray(8 * MiB)
            view = memoryview(buf)
            with conn:
                while conn.recv_into(view):
                    pass

        t = threading.Thread(target=sink)
        t.start()
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(data)
        t.join()
        srv.close()

    return median_seconds(once, runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gb", type=float, default=2.0)
    p.add_argument("--dir", default="/dev/shm")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="rtj-replica-bench-", dir=a.dir))
    out: dict[str, object] = {"gb": a.gb, "runs": a.runs, "cpus": os.cpu_count()}
    server = None
    try:
        n = int(a.gb * 1e9) // 4
        model = torch.nn.Module()
        for i, part in enumerate(torch.randn(n).split(64 * MiB // 4)):
            model.register_parameter(f"p{i}", torch.nn.Parameter(part.clone(), requires_grad=False))
        mgr = CheckpointManager(
            str(work / "persist"), rank=0, world_size=1, interval_steps=10**9,
            local_root=str(work / "mine"), local_interval_steps=1,
        )  # fmt: skip
        assert mgr.maybe_save(1, model) in ("saved", "snapshot") and mgr.wait(timeout=600)
        mgr.close(timeout=60)
        rank_dir = local_rank_dir(str(work / "mine"), 0)
        step, nonce = local_snapshots(rank_dir)[0]
        snap = os.path.join(rank_dir, next(x for x in os.listdir(rank_dir) if x.startswith("step-")))
        size = sum(os.path.getsize(os.path.join(snap, f)) for f in os.listdir(snap))
        out["bytes"] = size
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "rtj_trainer.peer_replica", "serve", str(work / "peer"), str(port)],
            env={**os.environ, "PYTHONPATH": PYTHONPATH},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and "serving" in server.stdout.readline()
        endpoint = f"127.0.0.1:{port}"
        out["put_s"] = median_seconds(lambda: send_snapshot(endpoint, snap, 0), a.runs)
        assert list_held(endpoint) == {0: [(step, nonce)]}
        fetched = work / "fetched"

        def get() -> None:
            shutil.rmtree(fetched, ignore_errors=True)
            fetch_snapshot(endpoint, 0, step, nonce, str(fetched))

        out["get_s"] = median_seconds(get, a.runs)
        got = os.path.join(fetched, os.path.basename(snap))
        bin_name = next(f for f in os.listdir(snap) if f.endswith(".bin"))
        with open(os.path.join(snap, bin_name), "rb") as f1, open(os.path.join(got, bin_name), "rb") as f2:
            out["get_exact"] = all(c1 == f2.read(len(c1)) for c1 in iter(lambda: f1.read(64 * MiB), b""))
        data = memoryview(bytearray(os.urandom(MiB)) * (size // MiB))
        out["loopback_floor_s"] = loopback_floor(data, a.runs)
        out["crc32_s"] = median_seconds(lambda: zlib.crc32(data), a.runs)
        out["put_vs_loopback"] = round(out["put_s"] / out["loopback_floor_s"], 2)  # type: ignore[operator]
        out["put_gb_s"] = round(size / out["put_s"] / 1e9, 3)  # type: ignore[operator]
        out["get_gb_s"] = round(size / out["get_s"] / 1e9, 3)  # type: ignore[operator]
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)
    line = json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()})
    print(line)
    if a.out:
        Path(a.out).write_text(line + "\n")


if __name__ == "__main__":
    main()
