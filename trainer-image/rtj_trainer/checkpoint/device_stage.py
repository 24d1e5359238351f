"""Memory snapshots staged on the GPU: training waits only for a device-to-device copy.

With the memory tier on a GPU, a snapshot is first copied, on the training stream, into one flat
CUDA buffer laid out like the memory tier's slot file (`snapshot_ring.layout`): one multi-tensor
copy at the GPU memory's speed (milliseconds for 13.7 GB on an H200), after which training changes
its state freely: no fence before the next optimizer step, which the pinned path
(`staging.HostStaging`) needs because its device-to-host copy reads the live tensors. The writer
thread then drains the buffer into the slot's file through a small ring of pinned chunks
(`ChunkPipe`), the host side copied by the pod's slot copier (`rtj_trainer.slot_copier`: another
process, so the rank never holds the slot's pages) or, without one, by our own threads
(`copy_bytes`), never torch's intra-op pool: no pinned buffer of the state's size is allocated
(pinning 13.7 GB took 6-7 s and held the CUDA driver meanwhile) and the slot needs no registration
with CUDA (0.72 s per GB); only the chunks are pinned (with the copier: registered, being shared).

A restarted rank loads the same way backwards (`load`): the slot's file through the chunks into a
flat buffer, then device-to-device into the model. That buffer is given back to the driver right
after the load: how much memory the first steps need is not known yet; `prepare` (after the first
step) keeps a buffer only when the GPU has room for it beside what training reserved (`fits`), else
snapshots take the pinned path. A new rank process starts that load ahead of need (`prefetch`, in
a thread of its own, from the rank's newest committed snapshot): the bytes cross to the GPU while
the rank sets up its process group and builds its model, and the resume, when the ranks agree on
that snapshot, finds them there (1xH100, 13.7 GB: the load took 0.97 s of a 3.96 s in-job restart,
after 1.15 s of process group and 0.14 s of model build, done one after the other).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ..checkpoint_format import TensorEntry
from ..slot_copier import CopierClient
from .state_tree import dtype_named

log = logging.getLogger(__name__)

#: Memory the GPU keeps free beside the staging buffer: the larger of these (bytes, fraction of
#: the GPU's memory). Training's own peak is already reserved when `fits` is asked (after a step).
HEADROOM_BYTES = 2 << 30
HEADROOM_FRACTION = 0.05
#: The pinned ring between the GPU and the mapped files: this many chunks of this size. Each chunk
#: costs the drain's thread a few trips through the GIL (its event, its host copy, the next
#: chunk's copy call), and each trip may hold up the training thread's next torch call: on the CPU
#: stand-in (2 cores, 4 GiB drained, 5 runs, `bench/drain_interference.py`) the main thread kept a
#: median 0.95 of its rate of small torch ops beside a drain in 64 MiB chunks, 0.98 in 256 MiB, 0.99
#: in 512 MiB. Two chunks keep the host copy, the slower side, busy: one crosses the bus while the
#: other is copied.
CHUNK_BYTES = 256 << 20
CHUNKS = 2
#: Threads copying the mapped snapshot into the chunks when a restarted rank loads: one thread's
#: memory copy (about 10 GB/s) is what bounds the load, not the bus, and the rank does nothing else
#: meanwhile (the drain during training keeps `memory_snapshot_write_threads`). bench/snapshot_paths.py
#: times 1 to 16: 13.7 GB in 2.72 s with 1, 0.92 s with 4, 0.61 s with 8 (H100 host, 2026-12-06).
LOAD_THREADS = 8


class CudaOps:
    """The CUDA calls `ChunkPipe` and `DeviceStage` make, in one place: tests/trainer_ckpt runs the
    same code on the CPU through a synchronous stand-in (the offsets, the chunk ring, the layout)."""

    pin = True  # the chunks are pinned host memory

    def holds(self, t: torch.Tensor) -> bool:
        """Whether `t` lives on the device (is staged there, not cloned on the host)."""
        return t.is_cuda

    def active(self) -> bool:
        """Whether this process uses the device (a restarted rank loads through it only then)."""
        return torch.cuda.is_initialized()

    def current_device(self) -> int:
        return torch.cuda.current_device()

    def set_device(self, device: int) -> None:
        torch.cuda.set_device(device)

    def release(self) -> None:
        """Give the memory no tensor holds back to the driver."""
        torch.cuda.empty_cache()

    def stream(self) -> Any:
        return torch.cuda.Stream()

    def event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing)

    def current_stream(self) -> Any:
        return torch.cuda.current_stream()

    def on_device(self, device: int) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.device(device)

    def on_stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def mem_get_info(self, device: int) -> tuple[int, int]:
        return torch.cuda.mem_get_info(device)

    def buffer(self, nbytes: int, device: int) -> torch.Tensor:
        return torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device))

    def register(self, t: torch.Tensor) -> None:
        """Pin the host memory of `t` (shared memory the copier also maps) for the device's copies."""
        nbytes = t.numel() * t.element_size()
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 1)  # 1: portable
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister of {nbytes} bytes: CUDA error {int(err)}")

    def unregister(self, t: torch.Tensor) -> None:
        """Unpin what `register` pinned (before its memory is unmapped)."""
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


CUDA = CudaOps()


def fits(nbytes: int, device: int, ops: CudaOps = CUDA) -> bool:
    """Whether a buffer of `nbytes` leaves the GPU its headroom (memory not reserved by torch)."""
    free, total = ops.mem_get_info(device)
    return free >= nbytes + max(HEADROOM_BYTES, int(HEADROOM_FRACTION * total))


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst[...] = src` for CPU tensors, in the calling thread alone: one memmove (ctypes releases the
    GIL) when both are contiguous and of one size in bytes, else torch's `copy_`.

    torch's `copy_` spreads a large CPU copy over its intra-op threads (OpenMP, as many as cores), and
    a snapshot drains beside training: on the 2-core machine, with a thread copying 64 MiB pieces
    that way, the main thread kept a median 0.89 of its rate of small torch ops (0.68-0.97, 8 runs),
    with one memmove per piece 0.95 (0.82-1.00), copying 7.2 and 7.6 GB/s
    (`bench/host_copy_interference.py`). The drain's parallelism is ours to size instead
    (`snapshot_write_threads`)."""
    n = dst.numel() * dst.element_size()
    if dst.is_contiguous() and src.is_contiguous() and n == src.numel() * src.element_size():
        if n:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), n)
        return
    dst.copy_(src)


def entry_views(flat: torch.Tensor, entries: Sequence[TensorEntry]) -> list[torch.Tensor]:
    """The tensors of `entries` as views of the flat byte buffer laid out by them."""
    return [flat[e.offset : e.offset + e.nbytes].view(dtype_named(e.dtype)).reshape(e.shape) for e in entries]


class ChunkPipe:
    """Bytes between a flat CUDA buffer and flat host memory (pageable: a mapped file) through a ring
    of pinned chunks; each chunk's host side is copied while the next chunks cross the bus.

    With the pod's slot copier (`copier`) the chunks are shared memory (memfds registered with
    CUDA) and the copier copies each between its chunk and the slot file, given the file's
    descriptor: the rank never touches the slot's pages (see `rtj_trainer.slot_copier`). Without
    one, or for host memory that is no slot file, the rank copies (`copy_bytes`). Either way a copy
    on the way to the host (a drain, beside training) takes `threads` threads and one on the way
    back (a load) `load_threads`: a copier's threads take cores from training as the rank's own
    would (on 2 cores, a drain whose chunks the copier copied on 8 threads left the training thread
    0.78 of its rate, on 1 thread 0.995; `bench/drain_interference.py`)."""

    def __init__(
        self,
        device: int,
        threads: int,
        chunk_bytes: int = CHUNK_BYTES,
        depth: int = CHUNKS,
        ops: CudaOps = CUDA,
        load_threads: int = LOAD_THREADS,
        copier: CopierClient | None = None,
    ) -> None:
        self.device = device
        self.ops = ops
        self.copier = copier
        self._registered: list[torch.Tensor] = []  # shared chunks pinned by `CudaOps.register`
        self._retired: list[torch.Tensor] = []  # chunks a copier that would not die may still write
        self.threads = max(1, threads)
        self.load_threads = max(1, load_threads)
        self.chunk_bytes = chunk_bytes
        self.depth = depth
        self.chunks: list[torch.Tensor] = []
        self._lock = threading.Lock()
        self._stream: Any = None
        self._events: list[Any] = []
        #: The last `to_host`'s seconds waiting for chunks to leave the GPU and copying them into
        #: host memory (the writer thread's time: where a slow drain went).
        self.last_drain: tuple[float, float] | None = None
        most = max(self.threads, self.load_threads)
        self._pool = ThreadPoolExecutor(most, "rtj-ckpt-copy") if most > 1 else None

    def allocate(self) -> None:
        """Pin the chunks (once)."""
        with self._lock:
            if self.chunks:
                return
            with self.ops.on_device(self.device):
                self._stream = self.ops.stream()
                self._events = [self.ops.event() for _ in range(self.depth)]
                shared = self._shared_chunks() if self.copier is not None else None
                self.chunks = shared or [
                    torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=self.ops.pin)
                    for _ in range(self.depth)
                ]

    def _shared_chunks(self) -> list[torch.Tensor] | None:
        """Chunks the copier maps too: memfds, registered with CUDA here, handed to the copier;
        None (and no copier from now on) when they cannot be made or registered. Made and
        registered but refused by the copier, they serve the rank's own copies."""
        assert self.copier is not None
        fds: list[int] = []
        try:
            chunks = []
            for _ in range(self.depth):
                fds.append(os.memfd_create("rtj-ckpt-chunk", os.MFD_CLOEXEC))
                os.ftruncate(fds[-1], self.chunk_bytes)
                path = f"/proc/self/fd/{fds[-1]}"
                chunks.append(torch.from_file(path, shared=True, size=self.chunk_bytes, dtype=torch.uint8))
            for chunk in chunks:
                self.ops.register(chunk)
                self._registered.append(chunk)
        except (OSError, RuntimeError) as e:
            self._unregister()
            self._without_copier(e)
            return None
        try:
            self.copier.attach(fds)
        except OSError as e:
            self._without_copier(e)
        finally:
            for fd in fds:
                os.close(fd)
        return chunks

    def _unregister(self) -> None:
        """Unpin the shared chunks before they are unmapped (dropped)."""
        registered, self._registered = self._registered, []
        for chunk in registered:
            self.ops.unregister(chunk)

    def _without_copier(self, e: BaseException) -> None:
        log.warning("memory snapshots copied in the rank from now on, not by the pod's slot copier: %r", e)
        copier, self.copier = self.copier, None
        if copier is not None:
            copier.close()

    def to_host(
        self, src: torch.Tensor, dst: torch.Tensor, after: Any = None, dst_fd: int | None = None
    ) -> Any:
        """Copy the flat CUDA bytes `src` into the flat host bytes `dst` (same length; `dst_fd`: the
        slot file `dst` maps, for the copier) once the CUDA event `after` has happened; returns an
        event recorded on the pipe's stream when its reads of `src` are done (the buffer may then
        be overwritten)."""
        self.allocate()
        stream = self._stream
        pending: list[tuple[int, int, int]] = []  # (chunk, start, length): on its way to the host
        spent = [0.0, 0.0]
        with self.ops.on_device(self.device), self.ops.on_stream(stream):
            if after is not None:
                stream.wait_event(after)
            for i, start in enumerate(range(0, src.numel(), self.chunk_bytes)):
                if len(pending) == self.depth:
                    self._land(pending.pop(0), dst, dst_fd, spent)
                n = min(self.chunk_bytes, src.numel() - start)
                k = i % self.depth
                self.chunks[k][:n].copy_(src[start : start + n], non_blocking=True)
                self._events[k].record(stream)
                pending.append((k, start, n))
            for item in pending:
                self._land(item, dst, dst_fd, spent)
            done = self.ops.event()
            done.record(stream)
        self.last_drain = (spent[0], spent[1])
        return done

    def to_device(self, src: torch.Tensor, dst: torch.Tensor, src_fd: int | None = None) -> None:
        """Copy the flat host bytes `src` (`src_fd`: the slot file it maps, for the copier) into the
        flat CUDA bytes `dst`; returns when they are there."""
        self.allocate()
        stream = self._stream
        with self.ops.on_device(self.device), self.ops.on_stream(stream):
            for i, start in enumerate(range(0, src.numel(), self.chunk_bytes)):
                n = min(self.chunk_bytes, src.numel() - start)
                k = i % self.depth
                self._events[k].synchronize()  # the chunk's previous upload has left it
                if not self._by_copier("get", k, n, src_fd, start):
                    self._copy(self.chunks[k][:n], src[start : start + n], self.load_threads)
                dst[start : start + n].copy_(self.chunks[k][:n], non_blocking=True)
                self._events[k].record(stream)
        stream.synchronize()

    def _land(
        self, item: tuple[int, int, int], dst: torch.Tensor, dst_fd: int | None, spent: list[float]
    ) -> None:
        k, start, n = item
        t0 = time.perf_counter()
        self._events[k].synchronize()
        t1 = time.perf_counter()
        if not self._by_copier("put", k, n, dst_fd, start):
            self._copy(dst[start : start + n], self.chunks[k][:n], self.threads)
        spent[0] += t1 - t0
        spent[1] += time.perf_counter() - t1

    def _by_copier(self, op: str, k: int, n: int, fd: int | None, offset: int) -> bool:
        """Chunk k's n bytes to (put) or from (get) the slot file `fd` at `offset` by the copier;
        False when the rank must copy them itself (no copier, no file, or the copier failed)."""
        if self.copier is None or fd is None:
            return False
        try:
            if op == "put":  # a drain beside training: the threads it is configured with
                self.copier.put(k, n, fd, offset, self.threads)
            else:  # a load: the rank waits for it
                self.copier.get(k, n, fd, offset, self.load_threads)
        except (OSError, ValueError) as e:  # refused, or the copier is gone (dead: it writes no more)
            self._without_copier(e)
            return False
        except RuntimeError as e:  # hung and not dead: it may still write the request's slot or chunk
            self._without_copier(e)
            # Private chunks for the copies to come (these stay mapped, never used); this one fails.
            self._retired.extend(self.chunks)
            self.chunks, self._registered = [], []
            raise
        return True

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, threads: int) -> None:
        if self._pool is None or threads == 1 or dst.numel() < 2 * threads * 4096:
            copy_bytes(dst, src)
            return
        part = -(-dst.numel() // threads)
        futures = [
            self._pool.submit(copy_bytes, dst[i : i + part], src[i : i + part])
            for i in range(0, dst.numel(), part)
        ]
        for f in futures:
            f.result()

    def close(self) -> None:
        """After the last copy: the copier's connection closed, the shared chunks unpinned."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        if self.copier is not None:
            self.copier.close()
        self._unregister()
        self.chunks = []


class Prefetch:
    """A load begun ahead of need (`DeviceStage.prefetch`): its thread, and the buffer it filled."""

    def __init__(self, key: Hashable, load: Callable[[], torch.Tensor | None]) -> None:
        self.key = key
        self.started = time.monotonic()
        self.seconds: float | None = None  # how long the load took, once done
        self._flat: torch.Tensor | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(load,), name="rtj-ckpt-prefetch", daemon=True)
        self._thread.start()

    def _run(self, load: Callable[[], torch.Tensor | None]) -> None:
        try:
            self._flat = load()
        except Exception as e:  # raised to nobody: the resume loads as if there were no prefetch
            self._error = e
        self.seconds = time.monotonic() - self.started

    @property
    def pending(self) -> bool:
        """Whether the load is still running."""
        return self._thread.is_alive()

    def take(self) -> torch.Tensor | None:
        """Wait for the load; its buffer (None: no room on the GPU, or it failed, logged), once."""
        self._thread.join()
        if self._error is not None:
            log.warning("the memory snapshot prefetched to the GPU failed: %r", self._error)
        flat, self._flat = self._flat, None
        return flat


class DeviceStage:
    """The flat CUDA buffer a snapshot is staged in, and its way to and from the memory tier."""

    def __init__(
        self,
        threads: int,
        ops: CudaOps = CUDA,
        copier: Callable[[], CopierClient | None] | None = None,
        file_of: Callable[[torch.Tensor], int | None] | None = None,
    ) -> None:
        """`copier` connects to the pod's slot copier (None: there is none); `file_of` gives the
        descriptor of the slot file a host tensor maps (`SnapshotRing.file_of`), for the copier."""
        self.threads = threads
        self.ops = ops
        self._connect = copier
        self._file_of = file_of
        self.flat: torch.Tensor | None = None
        self._device: int | None = None  # where `flat` is
        self.pipe: ChunkPipe | None = None
        self._drained: Any = None  # the last drain's reads of `flat` are done once it has happened
        #: A load begun ahead of need; `load` with its key takes it, anything else discards it.
        self.prefetched: Prefetch | None = None
        #: The last prefetch once taken or discarded: (whether a load took its buffer, the seconds
        #: it took). For the resume's record.
        self.last_prefetch: tuple[bool, float | None] | None = None

    def size(self) -> int:
        return self.flat.numel() if self.flat is not None else -1

    def _pipe(self, device: int) -> ChunkPipe:
        if self.pipe is None or self.pipe.device != device:
            if self.pipe is not None:
                self.pipe.close()
            copier = self._connect() if self._connect is not None else None
            self.pipe = ChunkPipe(device, self.threads, ops=self.ops, copier=copier)
        return self.pipe

    def close(self) -> None:
        """Give up the chunk pipe (and its connection to the copier); the next use makes another."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe.close()

    @contextlib.contextmanager
    def _slot_fd(self, host: torch.Tensor) -> Iterator[int | None]:
        """A descriptor of the slot file `host` maps (None: it maps none), closed afterwards."""
        fd = self._file_of(host) if self._file_of is not None else None
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    # --- a background thread (`HostStaging.prepare`) -----------------------------------------------
    def prepare(self, size: int, device: int) -> bool:
        """Keep a buffer of `size` bytes on `device` if the GPU has room for it; True when kept."""
        if self.flat is not None and self.flat.numel() == size and self._device == device:
            return True
        self.flat = None
        self.discard_prefetch()  # never held beside a staging buffer (the resume took it long since)
        if size == 0 or not fits(size, device, self.ops):
            return False
        self._pipe(device).allocate()
        self.flat = self.ops.buffer(size, device)
        self._device = device
        self._drained = None
        return True

    # --- the training thread -------------------------------------------------------------------------
    def stage(
        self, tensors: Sequence[torch.Tensor], entries: Sequence[TensorEntry]
    ) -> tuple[torch.Tensor, Any, Any]:
        """Copy `tensors` (CUDA) into the buffer at `entries`, on the current stream: (the buffer,
        the start and end CUDA events of the copy). The drain is handed that buffer: a `prepare`
        meanwhile for another layout replaces `flat`, never the bytes of a snapshot in flight."""
        flat = self.flat
        assert flat is not None
        stream = self.ops.current_stream()
        if self._drained is not None:  # the previous snapshot has left the buffer (long since)
            stream.wait_event(self._drained)
        start, done = self.ops.event(timing=True), self.ops.event(timing=True)
        start.record(stream)
        if tensors:
            torch._foreach_copy_(entry_views(flat, entries), list(tensors))
        done.record(stream)
        return flat, start, done

    # --- the writer thread ---------------------------------------------------------------------------
    def drain(self, flat: torch.Tensor, dst: torch.Tensor, staged: Any) -> None:
        """The snapshot staged in `flat` (after the CUDA event `staged`) into the flat host bytes
        `dst`; returns once every byte is there."""
        assert self._device is not None
        with self._slot_fd(dst) as fd:
            self._drained = self._pipe(self._device).to_host(flat, dst, after=staged, dst_fd=fd)

    # --- a restarted rank ------------------------------------------------------------------------------
    def prefetch(self, key: Hashable, whole: torch.Tensor, device: int) -> None:
        """Begin `load(whole, device)` in a thread of its own; `load(..., key=key)` takes its buffer
        (waiting for it as needed). One at a time: a second is ignored."""
        if self.prefetched is None:
            self.prefetched = Prefetch(key, lambda: self._load(whole, device))

    def discard_prefetch(self) -> None:
        """Wait for a prefetch no load took (it uses the pipe's chunks) and give its buffer back."""
        pending, self.prefetched = self.prefetched, None
        if pending is None:
            return
        if pending.take() is not None:
            self.ops.release()
        self.last_prefetch = (False, pending.seconds)

    def load(self, whole: torch.Tensor, device: int, key: Hashable = None) -> torch.Tensor | None:
        """The flat host bytes `whole` (a mapped snapshot) copied into a new CUDA buffer, or None
        when the GPU has no room for one: the prefetched one when `key` is the prefetch's. The
        caller drops it after the load; see the module doc."""
        pending = self.prefetched
        if pending is not None and key is not None and pending.key == key:
            self.prefetched = None
            flat = pending.take()
            self.last_prefetch = (flat is not None, pending.seconds)
            if flat is not None:
                return flat
        self.discard_prefetch()
        return self._load(whole, device)

    def _load(self, whole: torch.Tensor, device: int) -> torch.Tensor | None:
        """Room means twice the snapshot's size: while the buffer is held, the load may allocate as
        much again (an optimizer's state is created by it)."""
        if whole.numel() == 0 or not fits(2 * whole.numel(), device, self.ops):
            return None
        flat = self.ops.buffer(whole.numel(), device)
        with self._slot_fd(whole) as fd:
            self._pipe(device).to_device(whole, flat, src_fd=fd)
        return flat
