"""Host staging: the rank's state copied into reused host buffers, the only part training waits for.

With the memory tier on a GPU that has room for it, the state is staged on the GPU (`device_stage`):
training waits for a device-to-device copy only and the writer thread drains it into the memory
tier's file. Otherwise, on GPU, the copy runs on a side CUDA stream into pinned buffers, and the
training stream waits for it only right before the next `optimizer.step()` (an optimizer pre-hook
calls `fence`), so the copy overlaps the next forward/backward. On CPU it is a plain copy.

Where the bytes land is a `HostBuffers`: `PinnedBuffers` (private pinned memory, allocated once and
reused) without a memory tier; with one, `snapshot_ring.SnapshotRing`: the memory tier's own files
mapped (on CPU the copy lands there; on a GPU the writer copies into them, from the GPU staging
buffer or from pinned buffers).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..checkpoint_format import TensorEntry
from .device_stage import DeviceStage
from .expected_state import state_specs
from .state_tree import local_shard

log = logging.getLogger("rtj_trainer")


@dataclass
class Snapshot:
    """One save's state in host memory, handed from the training thread to the writer."""

    step: int
    nonce: int
    skeleton: Any
    host: list[torch.Tensor]
    ready: Any  # torch.cuda.Event (the copy is done once it is) or None (done already)
    extra: dict[str, Any] = field(default_factory=dict)
    #: Offered to the peer replica: decided by all ranks together (`CheckpointManager.save`).
    replicate: bool = False
    #: The memory tier's slot the tensors were copied into (`SnapshotRing`), and where each lies in
    #: it; None: `host` are private buffers, copied into the tiers by the writer.
    partial: str | None = None
    entries: list[Any] | None = None
    #: The slot's tensors when `host` are pinned staging buffers the writer copies into it (a GPU).
    slot: list[torch.Tensor] | None = None
    #: Staged on the GPU (`device_stage`): brings the state into `host`, in the writer thread.
    drain: Callable[[], None] | None = None
    _drain_error: BaseException | None = None

    @property
    def tree(self) -> dict[str, Any]:
        """What the shard's index holds besides the tensors."""
        return {"state": self.skeleton, "extra": self.extra}

    @property
    def lost(self) -> bool:
        """Bringing the state into `host` failed: it is not written anywhere (reported once)."""
        return self._drain_error is not None

    def wait_copied(self) -> None:
        """Return once `host` holds the state (raises if bringing it there failed)."""
        if self.ready is not None:
            self.ready.synchronize()
        if self._drain_error is not None:  # `host` holds no complete state: never written anywhere
            raise self._drain_error
        if self.drain is not None:
            drain, self.drain = self.drain, None
            try:
                drain()
            except BaseException as e:
                self._drain_error = e
                raise


class HostBuffers(Protocol):
    """Where a snapshot's tensors are copied to: one host tensor per state tensor, in order (a
    shared-memory ring can lay them out in one file: it sees the whole layout at once)."""

    def buffers(self, specs: Sequence[torch.Tensor], pin: Sequence[bool]) -> list[torch.Tensor]:
        """Host tensors of `specs`' shapes and dtypes (reused while they match), pinned where `pin`."""
        ...

    def prepare(self, specs: Sequence[torch.Tensor], pin: Sequence[bool], drained: bool = False) -> None:
        """Do ahead, in a background thread, what `buffers` would allocate, map or pin (`drained`:
        the snapshots are staged on the GPU and drained through `DeviceStage`'s chunks)."""
        ...

    def expect(self) -> None:
        """A `prepare` is about to start (called before its thread starts)."""
        ...

    def next_slot_ready(self) -> bool:
        """While a `prepare` runs: whether a save now has what it needs ready."""
        ...


class FlatHostBuffers(HostBuffers, Protocol):
    """Host buffers that can also be had as one flat byte tensor laid out like the memory tier's
    slot file (`snapshot_ring.SnapshotRing`): what a snapshot staged on the GPU drains into."""

    def layout(self, specs: Sequence[torch.Tensor]) -> tuple[list[TensorEntry], int]: ...

    def flat(self, specs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The claimed snapshot's flat bytes and the tensors' views of them."""
        ...


class PinnedBuffers:
    """Private host buffers, pinned where the state is on CUDA, allocated once and reused."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def buffers(self, specs: Sequence[torch.Tensor], pin: Sequence[bool]) -> list[torch.Tensor]:
        for i, (spec, pinned) in enumerate(zip(specs, pin, strict=True)):
            if i < len(self.tensors):
                buf = self.tensors[i]
                if buf.shape == spec.shape and buf.dtype == spec.dtype:
                    continue
            buf = torch.empty(spec.shape, dtype=spec.dtype, device="cpu", pin_memory=pinned)
            if i < len(self.tensors):
                self.tensors[i] = buf
            else:
                self.tensors.append(buf)
        del self.tensors[len(specs) :]
        return list(self.tensors)

    def prepare(self, specs: Sequence[torch.Tensor], pin: Sequence[bool], drained: bool = False) -> None:
        self.buffers(specs, pin)

    def expect(self) -> None:
        pass

    def next_slot_ready(self) -> bool:
        return False  # every buffer at once, when `prepare` is done


class HostStaging:
    """The device-to-host copy of a snapshot, the fence that keeps it consistent, and the
    background allocation of the buffers (`prepare`)."""

    def __init__(self, buffers: HostBuffers | None = None, device: DeviceStage | None = None) -> None:
        self.buffers: HostBuffers = buffers if buffers is not None else PinnedBuffers()
        #: Staging on the GPU (`device_stage`), used while it holds a buffer of the state's layout.
        self.device = device
        self.preparer: threading.Thread | None = None  # allocating the pinned host buffers
        self._staged_ready = threading.Event()  # the GPU staging buffer decided (`prepare`)
        self._stream: Any = None
        self._fence_event: Any = None
        self._copy_events: tuple[Any, Any] | None = None
        self._hooked: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    @property
    def preparing(self) -> bool:
        """A save now would wait for `prepare`: its GPU buffer or the slot it would take is not
        ready yet (a ring's later slots are prepared while the first snapshots are taken)."""
        if self.preparer is None or not self.preparer.is_alive():
            return False
        return not (self._staged_ready.is_set() and self.buffers.next_slot_ready())

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """Allocate the host buffers in a background thread (see `CheckpointManager.prepare`). An
        optimizer with no state yet is never given one here (torch's `get_state_dict` would, by a
        step): its state's layout is foreseen (`expected_state`), else nothing is prepared and the
        first save allocates."""
        specs = state_specs(model, optimizer)
        if specs is None:
            log.info("the first save allocates the snapshot buffers: the optimizer has no state yet")
            return
        params = [local_shard(p) for p in model.parameters()]
        cuda = any(t.is_cuda for t in params)
        stage, flat = self.device, self._flat_buffers()
        device = stage.ops.current_device() if stage is not None and self._staged(params) else None

        staged_ready = self._staged_ready = threading.Event()
        self.buffers.expect()

        def allocate() -> None:
            pin, drained = [cuda] * len(specs), False
            if stage is not None and device is not None and flat is not None:
                stage.ops.set_device(device)
                if stage.prepare(flat.layout(specs)[1], device):
                    pin, drained = [False] * len(specs), True  # through the stage's pinned chunks
            staged_ready.set()
            self.buffers.prepare(specs, pin, drained=drained)

        self.preparer = threading.Thread(target=allocate, name="rtj-ckpt-prepare", daemon=True)
        self.preparer.start()

    def _flat_buffers(self) -> FlatHostBuffers | None:
        return self.buffers if hasattr(self.buffers, "flat") else None  # type: ignore[return-value]

    def _staged(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether a state of `tensors` is one to stage on the device (some of it lives there)."""
        return self.device is not None and any(self.device.ops.holds(t) for t in tensors)

    def copy_to_host(
        self, tensors: list[torch.Tensor], optimizer: torch.optim.Optimizer | None
    ) -> tuple[list[torch.Tensor], Any, Callable[[], None] | None]:
        """(the host buffers that hold or will hold `tensors`, the CUDA event marking the copy done
        or None: on CPU the copy is done on return, and the drain the writer thread runs to bring
        a snapshot staged on the GPU into the host buffers, or None)."""
        flat = self._flat_buffers()
        if self.device is not None and flat is not None and self._staged(tensors):
            entries, size = flat.layout(tensors)
            if self.device.size() == size:
                try:
                    return self._stage_on_device(flat, tensors, entries)
                except RuntimeError as e:  # CUDA refused it: the pinned path, from now on
                    log.warning("memory snapshots leave GPU staging for pinned buffers: %r", e)
                    self.device = None
        host = self.buffers.buffers(tensors, [t.is_cuda for t in tensors])
        if not any(t.is_cuda for t in tensors):
            for buf, t in zip(host, tensors, strict=True):
                buf.copy_(t)
            return host, None, None
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for buf, t in zip(host, tensors, strict=True):
                buf.copy_(t, non_blocking=t.is_cuda)
                if t.is_cuda:
                    t.record_stream(stream)
            ready = torch.cuda.Event(enable_timing=True)
            ready.record(stream)
        self._fence_event = ready
        self._copy_events = (start, ready)
        if optimizer is not None and optimizer not in self._hooked:
            optimizer.register_step_pre_hook(lambda *_: self.fence())
            self._hooked.add(optimizer)
        return host, ready, None

    def _stage_on_device(
        self, flat: FlatHostBuffers, tensors: list[torch.Tensor], entries: list[TensorEntry]
    ) -> tuple[list[torch.Tensor], Any, Callable[[], None]]:
        """The CUDA tensors copied into the GPU staging buffer on the current stream (nothing to
        fence: training's next kernels come after it on that stream); the CPU ones (an optimizer's
        step counts) cloned now. The drain brings both into the claimed slot's flat bytes."""
        assert self.device is not None
        on_gpu = [i for i, t in enumerate(tensors) if self.device.ops.holds(t)]
        staged_in, start, staged = self.device.stage(
            [tensors[i] for i in on_gpu], [entries[i] for i in on_gpu]
        )
        whole, host = flat.flat(tensors)  # claims the slot: after the one step that can raise
        kept = set(on_gpu)
        on_cpu = [(host[i], tensors[i].clone()) for i in range(len(tensors)) if i not in kept]
        device = self.device

        def drain() -> None:
            device.drain(staged_in, whole, staged)
            for view, saved in on_cpu:  # after the drain: it wrote its (unused) bytes there too
                view.copy_(saved)

        self._fence_event = None
        self._copy_events = (start, staged)
        return host, staged, drain

    def fence(self) -> None:
        """Make the current CUDA stream wait for the last snapshot copy (before mutating state)."""
        ev, self._fence_event = self._fence_event, None
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)

    def copy_seconds(self) -> float | None:
        """GPU time of the last snapshot's copy the training stream waited for or overlapped
        (device-to-host, or device-to-device when staged on the GPU), once done (else None)."""
        if self._copy_events is None or not self._copy_events[1].query():
            return None
        start, end = self._copy_events
        return start.elapsed_time(end) / 1000.0
