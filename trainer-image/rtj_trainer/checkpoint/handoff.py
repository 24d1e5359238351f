"""The emergency persist that a pod's entrypoint finishes after its ranks exit (a handoff).

On a graceful stop of its own pod, a rank commits the memory snapshot of the step the ranks agreed
on and exits without persisting it (`GracefulStop.save_and_exit`, `emergency_save(handoff=...)`).
It leaves a record in the pod's status dir naming the snapshot (`write_handoff`). The snapshot is a
file in the pod's memory volume, which outlives the rank. The entrypoint, which the kubelet stops
last, persists it from there (`HandoffPersister`) until just before the pod's grace period ends;
whoever holds rank 0's shard commits the checkpoint once every rank's shard is there, as rank 0's
writer would have.

Why: the ranks' own save had to end before the launcher's and the ranks' exits, which took most of
a short grace period (a 15 s grace left the ranks 3.75 s). Now the ranks free their GPUs as soon as
the step is in memory, and the persist gets nearly the whole grace period.

Ranks of a pod that got no signal (they stop because a peer pod did) persist in the rank, as before:
their entrypoint is not stopping, and their launcher may start new ranks at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from dataclasses import dataclass

from ..checkpoint_format import (
    HANDOFF_UNTIL,
    committed_name,
    partial_name,
    read_local_meta,
)
from ..report import write_atomic
from ..runtime_env import HANDOFF_FILE_PREFIX
from .events import EventLog
from .persistent import PersistentTier
from .shard_io import WriteControl, copy_shard

log = logging.getLogger(__name__)

#: How often the entrypoint looks for its ranks' records once its pod was signalled.
POLL_SECONDS = 0.02


@dataclass(frozen=True)
class Handoff:
    """A rank's record: persist its committed memory snapshot `snapshot` into `root`."""

    rank: int
    local_rank: int
    snapshot: str
    root: str
    keep: int
    #: The graceful-stop deadline the rank saved by: ties the record to one stop of the pod.
    stop_deadline: float | None


@dataclass(frozen=True)
class Persisted:
    """What became of one handed-off snapshot by the entrypoint's deadline."""

    handoff: Handoff
    step: int
    committed: bool
    seconds: float
    error: str | None = None


def handoff_path(status_dir: str, rank: int) -> str:
    return os.path.join(status_dir, f"{HANDOFF_FILE_PREFIX}{rank}.json")


def write_handoff(status_dir: str, h: Handoff) -> None:
    """The rank's record for its pod's entrypoint (atomic: never read half-written)."""
    write_atomic(handoff_path(status_dir, h.rank), json.dumps(dataclasses.asdict(h)))


def read_handoffs(status_dir: str) -> list[Handoff]:
    """The records in `status_dir` (an unreadable one is skipped: it may be replaced meanwhile)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in sorted(os.listdir(status_dir)):
            if not (name.startswith(HANDOFF_FILE_PREFIX) and name.endswith(".json")):
                continue
            try:
                with open(os.path.join(status_dir, name)) as f:
                    found.append(Handoff(**json.load(f)))
            except (OSError, ValueError, TypeError):
                continue
    return found


def _mark_handed_off(partial: str, rank: int, until: float) -> None:
    """`HANDOFF_UNTIL` in `partial`, whole or absent. Every rank's writer (threads here, other pods'
    entrypoints) writes it: each through a temporary file of its own, so that none renames away
    another's; the last one stands."""
    tmp = os.path.join(partial, f"{HANDOFF_UNTIL}.{rank}.tmp")
    with open(tmp, "w") as f:
        f.write(repr(until))
    os.replace(tmp, os.path.join(partial, HANDOFF_UNTIL))


class HandoffPersister:
    """The entrypoint's side: from its pod's stop on, persist every record of that stop as it
    appears, each in its own thread, until `deadline` (`time.time()`), when unfinished copies are
    aborted (their partial files dropped: never loaded)."""

    def __init__(
        self,
        status_dir: str,
        stop_deadline: float | None,
        deadline: float,
        write_bytes_per_s: float | None = None,
    ) -> None:
        """`write_bytes_per_s`: a throttle (tests of storage too slow for the grace period)."""
        self.status_dir = status_dir
        self.stop_deadline = stop_deadline
        self.deadline = deadline
        self.write_bytes_per_s = write_bytes_per_s
        self._ranks_gone = threading.Event()
        #: Every writer's abort: set by `wait` once the deadline passed (their copies and commit
        #: waits stop; their partial files are dropped).
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[int, threading.Thread] = {}
        self.results: dict[int, Persisted] = {}
        self._thread = threading.Thread(target=self._watch, name="rtj-handoff", daemon=True)

    def start(self) -> HandoffPersister:
        self._thread.start()
        return self

    def ranks_gone(self) -> None:
        """The launcher ended: no record comes any more once the status dir was read again."""
        self._ranks_gone.set()

    def wait(self) -> list[Persisted]:
        """Block until every record found is persisted (and committed) or the deadline passed."""
        self._thread.join(max(0.0, self.deadline - time.time()))
        with self._lock:
            workers = list(self._workers.values())
        for w in workers:
            w.join(max(0.0, self.deadline - time.time()))
        self._abort.set()  # what is still running now missed the deadline
        for w in workers:
            w.join(5.0)
        with self._lock:
            return [self.results[r] for r in sorted(self.results)]

    def _watch(self) -> None:
        while time.time() < self.deadline:
            last_look = self._ranks_gone.is_set()
            for h in read_handoffs(self.status_dir):
                if h.stop_deadline != self.stop_deadline or h.rank in self._workers:
                    continue  # another stop's record, or taken already
                worker = threading.Thread(
                    target=self._persist, args=(h,), name=f"rtj-handoff-{h.rank}", daemon=True
                )
                with self._lock:
                    self._workers[h.rank] = worker
                worker.start()
            if last_look:
                return
            self._ranks_gone.wait(POLL_SECONDS)

    def _persist(self, h: Handoff) -> None:
        t0 = time.monotonic()
        step = -1
        try:
            meta = read_local_meta(h.snapshot)
            step, nonce, world_size = int(meta["step"]), int(meta["nonce"]), int(meta["worldSize"])
            control = WriteControl(bytes_per_s=self.write_bytes_per_s, abort=self._abort)
            events = EventLog()
            # Not stale to the job's next ranks until the deadline, should they start meanwhile.
            partial = os.path.join(h.root, partial_name(step, nonce))
            os.makedirs(partial, exist_ok=True)
            _mark_handed_off(partial, h.rank, self.deadline)
            tier = PersistentTier(
                h.root,
                rank=h.rank,
                world_size=world_size,
                keep=h.keep,
                commit_timeout_s=max(0.0, self.deadline - time.time()),
                control=control,
                events=events,
                clean_stale=False,  # other pods may be writing their shards of this step now
            )
            extra = meta.get("extra") or {}
            tier.persist(step, nonce, extra, lambda part: copy_shard(h.snapshot, part, h.rank, control))
            if tier.awaiting_commit == step:  # not rank 0: it commits, wherever it is
                tier.wait_commit(time.monotonic() + max(0.0, self.deadline - time.time()))
            committed = os.path.isdir(os.path.join(h.root, committed_name(step)))
            faults = [e for e in events.drain() if e.kind == "fault"]
            error = faults[0].message if faults and not committed else None
            result = Persisted(h, step, committed, time.monotonic() - t0, error)
        except Exception as e:  # the snapshot or the volume is unreadable: said, never raised
            result = Persisted(h, step, False, time.monotonic() - t0, repr(e))
        with self._lock:
            self.results[h.rank] = result
