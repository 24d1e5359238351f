"""A SIGKILLed rank's teardown, its drains and a restarted rank's load, with and without the pod's slot
copier (rtj_trainer.slot_copier), on the product's own path.

Each round starts a "rank" process: a `CheckpointManager` with the memory tier in `--dir` (a tmpfs,
as the pod's memory volume), its snapshots staged on the device and drained through the chunk pipe
(`device_stage`), a state of `--gb` GB (linear layers and their AdamW state) snapshotted `--snapshots`
times so that every slot of the ring (keep 2 + 1) has been written. This process then SIGKILLs it and
times kill -> reaped: the kernel tears down what the rank has mapped before its files close (on a GPU,
before the driver frees its memory and NVRx's launcher starts the next rank). A second process,
the restarted rank, loads the newest snapshot and reports the load's seconds. Rounds alternate
between the rank copying its slots itself and the copier (`python -m rtj_trainer.slot_copier`, as
the entrypoint runs it) copying them. One JSON line.

`--device cuda` runs the real CUDA path (streams, pinned or registered chunks, the device buffer);
`--device cpu` the tests' synchronous stand-in for the device (tests/trainer_ckpt/host_device.py),
chunks not pinned.

    PYTHONPATH=trainer-image python bench/slot_copier.py --device cpu --gb 1 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint import CheckpointManager
from rtj_trainer.checkpoint.device_stage import DeviceStage
from rtj_trainer.slot_copier import CopierProcess, socket_path

WIDTH = 4096  # each layer: WIDTH x WIDTH float32 (64 MiB), and three times that with AdamW's state


def _rank(
    root: str, gb: float, device: str
) -> tuple[CheckpointManager, torch.nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(gb * 1e9 / (3 * WIDTH * WIDTH * 4)))
    dev = torch.device(device)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)]).to(dev)
    optim = torch.optim.AdamW(model.parameters())
    mgr = CheckpointManager(
        os.path.join(root, "persist"), rank=0, world_size=1, interval_steps=10**9,
        local_root=root, local_interval_steps=1, local_keep=2,
    )  # fmt: skip
    if device == "cpu":  # as `parts` gives a GPU rank its stage
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "trainer_ckpt"))
        from host_device import HostOps  # the tests' stand-in for the GPU

        parts = mgr._p
        stage = DeviceStage(1, ops=HostOps(), copier=parts.ring.copier, file_of=parts.ring.file_of)  # type: ignore[union-attr]
        parts.staging.device = parts.memory.device = stage  # type: ignore[union-attr]
    return mgr, model, optim


def child_snapshots(root: str, gb: float, device: str, snapshots: int) -> None:
    """The rank: snapshot `snapshots` times, report, then wait to be killed."""
    mgr, model, optim = _rank(root, gb, device)
    model(torch.ones(1, WIDTH, device=device)).sum().backward()
    optim.step()
    mgr.prepare(model, optim)
    wait_for(lambda: not mgr.preparing, timeout=600, interval=0.01, message="the slots prepared")
    drains, copier = [], None
    for step in range(1, snapshots + 1):
        t0 = time.perf_counter()
        assert mgr.maybe_save(step, model, optim)
        assert mgr.wait(timeout=600)
        drains.append(round(time.perf_counter() - t0, 3))
        pipe = mgr._p.memory.device.pipe  # type: ignore[union-attr]
        copier = pipe is not None and pipe.copier is not None
    print(json.dumps({"drains": drains, "by_copier": copier}), flush=True)
    time.sleep(3600)


def child_load(root: str, gb: float, device: str) -> None:
    """The restarted rank: load the newest snapshot, report its seconds."""
    mgr, model, optim = _rank(root, gb, device)
    t0 = time.perf_counter()
    resumed = mgr.load_latest(model, optim)
    seconds = time.perf_counter() - t0
    assert resumed is not None and resumed.source == "local"
    print(json.dumps({"load": round(seconds, 3), "step": resumed.step}), flush=True)


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)


def one_round(root: str, gb: float, device: str, snapshots: int, with_copier: bool) -> dict[str, Any]:
    copier = CopierProcess(socket_path(root)).start() if with_copier else None  # as the entrypoint runs it
    try:
        rank = _child("--child", "snapshots", "--dir", root, "--gb", str(gb), "--device", device,
                      "--snapshots", str(snapshots))  # fmt: skip
        assert rank.stdout is not None
        report = json.loads(rank.stdout.readline())
        held = _resident(rank.pid)
        t0 = time.perf_counter()
        rank.send_signal(signal.SIGKILL)
        rank.wait()
        reaped = time.perf_counter() - t0
        load = _child("--child", "load", "--dir", root, "--gb", str(gb), "--device", device)
        out, _ = load.communicate(timeout=600)
        loaded = json.loads(out.splitlines()[-1])
    finally:
        if copier is not None:
            copier.close()
    assert report["by_copier"] == with_copier, report
    return {"kill_to_reaped": round(reaped, 3), **held, "drains": report["drains"], "load": loaded["load"]}


def _resident(pid: int) -> dict[str, float]:
    """GB the process has present in its page tables: shared memory (the slots it maps, its chunks)
    and private memory (on the CPU stand-in, the "device" buffers too); what a kill tears down."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {f"{k.lower()}_gb": round(int(fields[k].split()[0]) / 1e6, 2) for k in ("RssShmem", "RssAnon")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gb", type=float, default=1.0, help="the rank's state (parameters and AdamW state)")
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu"
    )
    p.add_argument("--dir", default="/dev/shm", help="a tmpfs: the memory volume")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--snapshots", type=int, default=4, help="per rank: at least keep + 1 = 3 fill the ring")
    p.add_argument("--child", choices=("snapshots", "load"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child == "snapshots":
        return child_snapshots(a.dir, a.gb, a.device, a.snapshots)
    if a.child == "load":
        return child_load(a.dir, a.gb, a.device)
    rows: dict[str, list[dict[str, Any]]] = {"rank_copies": [], "copier": []}
    for _ in range(a.runs):
        for with_copier in (False, True):
            root = tempfile.mkdtemp(prefix="rtj-scb-", dir=a.dir)
            try:
                rows["copier" if with_copier else "rank_copies"].append(
                    one_round(root, a.gb, a.device, a.snapshots, with_copier)
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)

    def median(key: str, mode: str) -> float:
        values = [r[key] if key != "drains" else statistics.median(r[key][1:] or r[key]) for r in rows[mode]]
        return round(statistics.median(values), 3)

    keys = ("kill_to_reaped", "rssshmem_gb", "rssanon_gb", "drains", "load")
    summary = {mode: {k: median(k, mode) for k in keys} for mode in rows}
    print(json.dumps({
        "device": torch.cuda.get_device_name() if a.device == "cuda" else f"cpu ({os.cpu_count()} cores)",
        "gb": a.gb, "runs": a.runs, "snapshots_per_rank": a.snapshots, "slots": 3,
        "median": summary,
        "kill_to_reaped_ratio": round(
            summary["copier"]["kill_to_reaped"] / summary["rank_copies"]["kill_to_reaped"], 3
        ),
        "rows": rows,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
