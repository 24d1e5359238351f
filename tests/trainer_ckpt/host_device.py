"""A synchronous stand-in for the GPU of `rtj_trainer.checkpoint.device_stage` (its `CudaOps`), so
that the memory tier's GPU staging path runs on the CPU with real files: the flat staging buffer,
the chunk ring both ways, the room check and the manager's glue around them. Streams and events
are no-ops (every copy is done when it returns); the "device" holds every tensor but scalars, which
stay on the host as an optimizer's step counts do on a GPU. Speed and real CUDA streams are measured
by bench/snapshot_paths.py and the GPU smoke."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from rtj_trainer.checkpoint.device_stage import CudaOps, DeviceStage


class Done:
    """An event: everything has happened by the time it is asked."""

    def record(self, stream: object = None) -> None: ...

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: object) -> float:
        return 0.0


class Stream:
    def wait_event(self, event: object) -> None: ...

    def synchronize(self) -> None: ...


class HostOps(CudaOps):
    """`CudaOps` on the CPU, with `free` bytes of "device" memory (of 16 GiB: 5 % of it is less than
    the headroom), counting the calls that allocate, bind or free."""

    pin = False

    def __init__(self, free: int = 1 << 40) -> None:
        self.free = free
        self.calls: Counter[str] = Counter()

    def holds(self, t: torch.Tensor) -> bool:
        return t.dim() > 0

    def active(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def set_device(self, device: int) -> None:
        self.calls["set_device"] += 1

    def release(self) -> None:
        self.calls["release"] += 1

    def stream(self) -> Stream:
        return Stream()

    def event(self, timing: bool = False) -> Done:
        return Done()

    def current_stream(self) -> Stream:
        return Stream()

    def on_device(self, device: int) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def on_stream(self, stream: object) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return self.free, 16 << 30

    def buffer(self, nbytes: int, device: int) -> torch.Tensor:
        self.calls["buffer"] += 1
        return torch.empty(nbytes, dtype=torch.uint8)

    def register(self, t: torch.Tensor) -> None:
        self.calls["register"] += 1

    def unregister(self, t: torch.Tensor) -> None:
        self.calls["unregister"] += 1


def stage_on_host(mgr: object, ops: HostOps, threads: int = 2, chunk_bytes: int = 4096) -> DeviceStage:
    """Give a `CheckpointManager` with a memory tier a `DeviceStage` on the stand-in (small chunks:
    many of them for a small state), as `parts` gives one on a GPU."""
    parts = mgr._p  # type: ignore[attr-defined]
    ring = parts.ring  # the pod's slot copier where its memory root has one, as `parts` connects it
    stage = DeviceStage(threads=threads, ops=ops, copier=ring.copier, file_of=ring.file_of)
    stage._pipe(0).chunk_bytes = chunk_bytes
    parts.staging.device = parts.memory.device = stage
    return stage
