"""Memory snapshots without a second write: the memory tier's own files are where a snapshot lands.

The files form a ring of `keep + 1` slots in the pod's /dev/shm (`MemoryTier` recycles the oldest
snapshot the new one replaces; `prepare` adds spare slots while there are fewer snapshots than
that), each with its space reserved by `posix_fallocate` once (a full /dev/shm is then an error at
that point, the snapshot skipped and reported, never a SIGBUS inside a copy) and mapped shared once
per process, the mapping kept across the renames that commit and recycle it (it follows the file,
not its name). A snapshot's tensors are copied into the claimed slot's mapped file; the writer
thread then commits it: the index (each tensor's dtype, shape and offset, with its CRC32), the
metadata, one rename. A kill before the rename leaves a `.partial`, never loaded.

On CPU the copy lands in the slot directly. On a GPU with room for it, the snapshot is staged in a
GPU buffer of the slot's layout and the writer thread drains it into the slot through a few pinned
chunks (`device_stage`); otherwise the device-to-host copy goes to private pinned buffers (54 GB/s
on an H200) and the writer thread copies them into the slot. Either way the slot's pages are already
there (`prepare` reserves and maps them, `populate`): no syscall, no allocation per snapshot. A
drain through the pod's slot copier (`rtj_trainer.slot_copier`) is copied into the slot by the
copier, through its own mapping, which `prepare` asks it to populate: the rank's mapping of the slot
then holds no page, and a killed rank has no page tables of 41 GB to tear down before its GPU memory
is freed (`file_of` gives the copier each slot's file). Registering the slot files with CUDA would
save the host-side copy, but pinning them cost 0.72 s per GB on an H200 (9.9 s for 13.7 GB, holding
the driver while it runs: training ran at half speed meanwhile) and has to be done again by every
restarted process; bench/d2h_floor.py measures both."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import torch

from ..checkpoint_format import TensorEntry
from ..cpu_cgroup import usable_cpus
from ..slot_copier import CopierClient, populate_pages, reserve_pages
from .device_stage import entry_views
from .staging import PinnedBuffers

log = logging.getLogger(__name__)


class RingTier(Protocol):
    """What the ring asks of the memory tier (`memory_tier.MemoryTier`)."""

    def claim(self, step: int, nonce: int) -> str: ...
    def slot_file(self, slot_dir: str) -> str: ...
    def ring_files(self, size: int) -> list[str]: ...
    def report_failure(self, step: int, message: str) -> None: ...


#: Each tensor starts on this boundary in the file (views stay aligned; DMA likes it).
ALIGN = 4096
PAGE = mmap.PAGESIZE
#: Bytes `populate` makes present per madvise call. The call holds the process's mmap lock while it
#: faults the pages in, and an mmap or munmap in any thread (a large malloc, a CUDA host
#: allocation) waits for it, every later page fault behind that: one call over a 13.7 GB slot stalled
#: training for seconds on an H100 host. Per 16 MiB, another thread's mmap waited at most 30 ms
#: beside a 3 GB populate on the 2-core machine (`bench/populate_lock.py`), 1.2 s for one call.
POPULATE_CHUNK_BYTES = 16 << 20
#: Threads making a slot's pages present in the rank (no slot copier: tests, the pinned path, a plain
#: launch), per slot, while training runs its first steps: reserving the slot's pages, one thread
#: per file, is the slower half (`slot_copier.RESERVE_PIECE_BYTES`).
PREPARE_THREADS = max(1, min(4, usable_cpus() // 4))


def layout(specs: Sequence[torch.Tensor]) -> tuple[list[TensorEntry], int]:
    """Where each tensor lies in a slot's file, and the file's size."""
    entries: list[TensorEntry] = []
    offset = 0
    for t in specs:
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return entries, offset


def populate(whole: torch.Tensor, chunk_bytes: int = POPULATE_CHUNK_BYTES) -> None:
    """Map every page of a shared file mapping writable now, not page by page inside the first copy
    into it: madvise(MADV_POPULATE_WRITE) (Linux 5.14) over `chunk_bytes` at a time (`prepare`
    does the same a piece at a time, `reserve_pages`); where the kernel refuses it, `touch_from`."""
    touch_from(whole, populate_pages(whole.data_ptr(), whole.numel(), chunk_bytes))


def touch_from(whole: torch.Tensor, start: int) -> None:
    """Make the pages of `whole` from byte `start` on present where madvise was refused: a write of
    one byte per page, its own value (a committed snapshot keeps its bytes)."""
    if start < whole.numel():
        pages = whole[start:][::PAGE]
        pages.copy_(pages.clone())


@dataclass
class _Mapping:
    whole: torch.Tensor  # the file's bytes, mapped shared
    size: int
    fd: int  # the file, open for the slot copier (`file_of`)


class SnapshotRing:
    """The memory tier's `staging.HostBuffers`: views of the claimed slot's file."""

    def __init__(self, tier: RingTier, copier: Callable[[], CopierClient | None] | None = None) -> None:
        """`copier` connects to the pod's slot copier (None: there is none): it makes the slots'
        pages present in its own mappings, for the snapshots it drains (`prepare`)."""
        self._tier = tier
        self.copier = copier
        self._maps: dict[tuple[int, int], _Mapping] = {}  # (st_dev, st_ino) -> mapping
        self._lock = threading.Lock()
        #: (step, nonce) of the save about to copy (`claim`), and what `buffers` made of it.
        self._claim: tuple[int, int] | None = None
        self.partial: str | None = None
        self.entries: list[TensorEntry] = []
        #: The claimed slot's tensors when the copy goes through pinned buffers first (a GPU).
        self.slot: list[torch.Tensor] | None = None
        #: Pinned staging on a GPU, and where a snapshot lands when no slot could be had.
        self.fallback = PinnedBuffers()
        #: Where a snapshot staged on the GPU drains when no slot could be had (`flat`).
        self._private: torch.Tensor | None = None
        #: The latest `prepare` (`expect`): under way, how many slots it has made ready, and how
        #: many claims were made since it began.
        self._generation = 0
        self._preparing = False
        self._ready = self._claims = 0

    # --- the training thread -----------------------------------------------------------------------
    def claim(self, step: int, nonce: int) -> None:
        """The next `buffers` call is for snapshot (step, nonce)."""
        self._claim = (step, nonce)
        with self._lock:
            self._claims += 1

    def layout(self, specs: Sequence[torch.Tensor]) -> tuple[list[TensorEntry], int]:
        return layout(specs)

    def _claimed_slot(self, specs: Sequence[torch.Tensor]) -> tuple[list[TensorEntry], torch.Tensor | None]:
        """The claimed snapshot's slot mapped (recycled, or new), or None (reported) when none
        could be had: /dev/shm full, most likely; the snapshot then goes through private buffers."""
        if self._claim is None:
            raise RuntimeError("SnapshotRing.buffers without a claim")
        step, nonce = self._claim
        self._claim = None
        self.partial, self.entries = None, []
        self.slot = None
        entries, size = layout(specs)
        try:
            partial = self._tier.claim(step, nonce)
            whole = self._mapped(self._tier.slot_file(partial), size)
        except OSError as e:
            self._tier.report_failure(step, f"no memory-tier slot for step {step}: {e!r}")
            return entries, None
        self.partial, self.entries = partial, entries
        return entries, whole

    def flat(self, specs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The claimed snapshot's slot as flat bytes and the tensors' views of them (a snapshot
        staged on the GPU drains into it); private pageable bytes when no slot could be had."""
        entries, whole = self._claimed_slot(specs)
        if whole is None:
            size = layout(specs)[1]
            if self._private is None or self._private.numel() != size:
                self._private = torch.empty(size, dtype=torch.uint8)
            whole = self._private
        return whole, entry_views(whole, entries)

    def buffers(self, specs: Sequence[torch.Tensor], pin: Sequence[bool]) -> list[torch.Tensor]:
        """The claimed snapshot's slot (recycled, or new), as one host tensor per state tensor."""
        entries, whole = self._claimed_slot(specs)
        if whole is None:
            return self.fallback.buffers(specs, pin)
        views = entry_views(whole, entries)
        if any(pin):  # device-to-host into pinned memory; the writer fills the slot from it
            self.slot = views
            return self.fallback.buffers(specs, pin)
        return views

    # --- any thread --------------------------------------------------------------------------------
    def expect(self) -> None:
        """A `prepare` is on its way (the training thread, before it starts `prepare`'s thread): no
        slot counts as ready (`next_slot_ready`) until that `prepare` says so."""
        with self._lock:
            self._generation += 1
            self._ready = self._claims = 0
            self._preparing = True

    def next_slot_ready(self) -> bool:
        """Whether the slot the next claim takes is prepared (or no `prepare` is under way): a save
        before that would reserve and map the slot in the training thread."""
        with self._lock:
            return not self._preparing or self._claims < self._ready

    def prepare(self, specs: Sequence[torch.Tensor], pin: Sequence[bool], drained: bool = False) -> None:
        """Prepare the slots a coming snapshot may reuse, adding spare slots while the tier holds
        fewer than `keep`, so that no save maps, reserves or pins in the training thread: all slots
        at once, each reserved piece by piece while other threads make its reserved pieces present
        (`reserve_pages`), and counted ready (`next_slot_ready`) in the order claims take them: the
        first snapshot waits for its own slot only. Snapshots `drained` through the pod's slot
        copier have their slots reserved and their pages made present by the copier, not here:
        the rank then never holds them (`rtj_trainer.slot_copier`)."""
        with self._lock:
            generation = self._generation
        _entries, size = layout(specs)
        files = self._tier.ring_files(size)
        done = [False] * len(files)

        def one(k: int) -> None:
            copier = self.copier() if drained and self.copier is not None else None
            try:
                self._prepare_slot(files[k], size, copier)
            finally:
                if copier is not None:
                    copier.close()
                with self._lock:
                    done[k] = True
                    if self._generation == generation:
                        self._ready = next((i for i, d in enumerate(done) if not d), len(done))

        try:
            if any(pin):  # a save needs its pinned buffers as much as its slot
                self.fallback.prepare(specs, pin)
            # One thread per file: tmpfs reserves a file's pages one thread at a time (its inode
            # lock), so the files are reserved side by side.
            with ThreadPoolExecutor(max(1, len(files)), "rtj-ckpt-slots") as pool:
                for f in [pool.submit(one, k) for k in range(len(files))]:
                    f.result()
        finally:
            with self._lock:
                if self._generation == generation:
                    self._preparing = False

    def _prepare_slot(self, path: str, size: int, copier: CopierClient | None) -> None:
        """Reserve `path`'s `size` bytes and make its pages present: in the copier when there is one
        (where it fails, the rank reserves the space itself and the first drain makes the pages
        present), else here. A slot that cannot be reserved (/dev/shm full) is forgotten: the
        claim that takes it reserves it again, and reports the failure."""
        whole = self._mapped(path, size, reserve=False)
        fd = self.file_of(whole)
        if fd is None:  # an empty state
            return
        try:
            if copier is not None:
                try:
                    copier.reserve(fd)
                except OSError as e:
                    log.warning("the slot copier did not reserve a memory-tier slot: %r", e)
                    os.posix_fallocate(fd, 0, size)
                return
            with ThreadPoolExecutor(PREPARE_THREADS, "rtj-ckpt-slot") as pool:
                present = reserve_pages(fd, whole.data_ptr(), size, pool.submit, PREPARE_THREADS,
                                        chunk_bytes=POPULATE_CHUNK_BYTES)  # fmt: skip
            touch_from(whole, present)
        except OSError as e:
            log.warning("memory-tier slot %s not prepared: %r", path, e)
            self.forget(path)
        finally:
            os.close(fd)

    def mapped(self, path: str, size: int) -> torch.Tensor:
        """A committed snapshot's file mapped shared (a restarted rank loads from it; its next
        snapshot reuses the mapping)."""
        return self._mapped(path, size, grow=False)

    def file_of(self, whole: torch.Tensor) -> int | None:
        """A new descriptor (the caller closes it) of the slot file `whole` maps, None when it maps
        none (private bytes)."""
        with self._lock:
            for m in self._maps.values():
                if m.size and m.whole.data_ptr() == whole.data_ptr() and m.size == whole.numel():
                    return os.dup(m.fd)
        return None

    def forget(self, path: str) -> None:
        """`path` is about to be deleted: drop its mapping."""
        try:
            st = os.stat(path)
        except OSError:
            return
        with self._lock:
            m = self._maps.pop((st.st_dev, st.st_ino), None)
        if m is not None:
            os.close(m.fd)

    def close(self) -> None:
        with self._lock:
            maps, self._maps = self._maps, {}  # each mapping goes with its last view
        for m in maps.values():
            os.close(m.fd)

    def _mapped(self, path: str, size: int, *, grow: bool = True, reserve: bool = True) -> torch.Tensor:
        """`path` mapped shared, `size` bytes long (`grow`: created, resized and, with `reserve`, its
        space reserved as needed; else it must have that size); the mapping (and the file, open) is
        kept, so a file is mapped once per process. Mapping makes no page present: `populate` and
        `prepare` do."""
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if grow else 0) | os.O_CLOEXEC, 0o600)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            with self._lock:
                m = self._maps.get(key)
            if m is not None and m.size == size == st.st_size:
                os.close(fd)
                return m.whole
            if m is not None:  # resized below: a mapping past the end would fault
                with self._lock:
                    if self._maps.get(key) is m:
                        del self._maps[key]
                        os.close(m.fd)
            if st.st_size != size:
                if not grow:
                    raise OSError(f"{path} is {st.st_size} bytes, not {size}")
                os.ftruncate(fd, size)
            if grow and reserve and size:
                os.posix_fallocate(fd, 0, size)  # ENOSPC here, not a SIGBUS in a copy
            whole = (  # the file opened above, whatever its name is by now
                torch.from_file(f"/proc/self/fd/{fd}", shared=True, size=size, dtype=torch.uint8)
                if size
                else torch.empty(0, dtype=torch.uint8)
            )
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        m = _Mapping(whole, size, fd)
        with self._lock:
            old = self._maps.get(key)
            self._maps[key] = m
        if old is not None:
            os.close(old.fd)
        return whole
