"""How a rank tells the pod's heartbeat agent what it is doing, at no measurable cost.

Each rank owns one small JSON file, `<RTJ_STATUS_DIR>/rank-<LOCAL_RANK>.json` holding a
`contract.RankReport`, rewritten atomically (temporary file + os.replace) so the agent never reads
half a file. `step()` is called every training step: it only compares two numbers and writes when
~0.5 s have passed since the last write; everything else (state changes, checkpoints, faults) is
written at once.

Under ft_launcher, the same throttled tick also sends the NVRx rank heartbeat (hang detection:
a rank that stops calling `step()` for `rankHangTimeoutSeconds` is killed and restarted).
Under in-process restart, `step()` and `section()` also time the rank's sections and move its hang
deadline to the budget learned for the next one (rtj_trainer.hang_timeouts): a stalled step is
aborted after seconds, not after the soft timeout.

    reporter = RankReporter.from_env()
    reporter.state(PodState.TRAINING)
    for step in ...:
        ...
        with reporter.section(Section.CHECKPOINT) as save:  # a save gets the checkpoint budget
            if not manager.maybe_save(step, model, optimizer):
                save.discard()  # nothing was due: not a sample of a save's duration
        reporter.step(step)
    reporter.checkpoint_committed(step, datetime.now(UTC))

Without RTJ_STATUS_DIR (a script run outside the trainer runtime) every method is a no-op.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from rtj.contract import (
    ENV_STATUS_DIR,
    MAX_PERSIST_SECONDS,
    RANK_FILE_SUFFIX,
    CheckpointRef,
    Fault,
    FaultSeverity,
    PodState,
    RankReport,
    rank_file_name,
)

from .hang_timeouts import HangBudgets, NestedSection, Section, SectionClock
from .runtime_env import ENV_PROGRESS_FILE, PERMANENT_FILE_PREFIX

log = logging.getLogger(__name__)

#: Minimum seconds between two writes caused by step() alone.
STEP_WRITE_INTERVAL_SECONDS = 0.5

#: The process that created a RankReporter of its own (not `automatic`): the script reports
#: itself, so rtj_trainer.integrations.autoreport stands down in it.
_explicit_pid: int | None = None


def explicit_reporter_active() -> bool:
    return _explicit_pid == os.getpid()


def make_rank_monitor_client() -> Any | None:
    """An initialized NVRx RankMonitorClient when running under ft_launcher, else None."""
    if "FT_RANK_MONITOR_IPC_SOCKET" not in os.environ:
        return None
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
        return client
    except Exception as exc:  # the rank must still train without hang detection
        log.warning("NVRx rank monitor client unavailable: %s", exc)
        return None


def write_atomic(path: str, text: str) -> None:
    """Whole or not at all for a reader (no fsync: pod-local files that need not survive a crash)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def record_persisted(status_dir: str, local_rank: int, step: int, seconds: float) -> None:
    """A rank's emergency snapshot of `step` was persisted and committed by its pod's entrypoint after
    the rank exited (rtj_trainer.checkpoint.handoff): its status file says so, as the rank's own
    `checkpoint_committed` and `persisted` would have (the last heartbeat reads it). Never raises."""
    path = os.path.join(status_dir, rank_file_name(local_rank))
    try:
        with open(path) as f:
            report = RankReport.model_validate_json(f.read())
    except (OSError, ValueError):
        report = RankReport(local_rank=local_rank)
    report.checkpoint = CheckpointRef(step=int(step), time=datetime.now(UTC))
    report.persist_seconds = round(min(float(seconds), MAX_PERSIST_SECONDS), 3)
    report.updated = datetime.now(UTC)
    with contextlib.suppress(OSError):
        write_atomic(path, report.to_file())


class RankReporter:
    """Writes this rank's status file. Not thread-safe by design: call it from the training loop."""

    def __init__(
        self,
        status_dir: str | None,
        *,
        rank: int = 0,
        local_rank: int = 0,
        in_job_restarts: int = 0,
        progress_file: str | None = None,
        write_interval: float = STEP_WRITE_INTERVAL_SECONDS,
        ft_client: Any | None = None,
        automatic: bool = False,
    ) -> None:
        """`automatic`: created by autoreport for a script that reports nothing itself."""
        global _explicit_pid
        if not automatic:
            _explicit_pid = os.getpid()
        self._ft = ft_client
        self._path = os.path.join(status_dir, rank_file_name(local_rank)) if status_dir else None
        self._permanent_path = (
            os.path.join(status_dir, f"{PERMANENT_FILE_PREFIX}{local_rank}{RANK_FILE_SUFFIX}")
            if status_dir
            else None
        )
        self._progress_file = progress_file
        self._interval = write_interval
        self._last_write = 0.0
        #: Its own clock: event writes (a memory snapshot or replica every few steps) move
        #: _last_write, and must not starve the NVRx heartbeat (ft_launcher kills a silent rank).
        self._last_beat = 0.0
        #: The hot path's step, a plain attribute (cheaper to set than a model's); written with the report.
        self._step: int | None = None
        #: Times sections against the learned hang budgets while a deadline is attached.
        self._sections: SectionClock | None = None
        self._overdue: tuple[Section, float] | None = None
        self._unsettled: Callable[[], bool] | None = None
        self._report = RankReport(
            rank=rank, local_rank=local_rank, pid=os.getpid(), in_job_restarts=in_job_restarts
        )
        if self._path:
            os.makedirs(status_dir, exist_ok=True)  # type: ignore[arg-type]
            self._write()

    @classmethod
    def from_env(cls, automatic: bool = False) -> RankReporter:
        env = os.environ
        return cls(
            env.get(ENV_STATUS_DIR) or None,
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            in_job_restarts=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            progress_file=env.get(ENV_PROGRESS_FILE) or None,
            ft_client=make_rank_monitor_client(),
            automatic=automatic,
        )

    @property
    def enabled(self) -> bool:
        return self._path is not None

    # --- the hot path -----------------------------------------------------------------------
    def step(self, n: int) -> None:
        """Record the current training step; writes at most every `write_interval` seconds."""
        self._step = n
        if self._sections is not None:
            self._sections.step()
        if self._path is None and self._ft is None:
            return
        now = time.monotonic()
        if not self.keep_alive(now) and now - self._last_write >= self._interval:
            self._write(now)

    def keep_alive(self, now: float | None = None) -> bool:
        """The NVRx heartbeat, at most every `write_interval` seconds: also for a rank that waits
        outside its steps (ft_launcher's rank monitor kills a rank that has gone silent). Each
        heartbeat rewrites the file with its time, so the agent measures a killed rank's silence
        as the rank monitor did. True if it sent one."""
        now = time.monotonic() if now is None else now
        if self._ft is None or now - self._last_beat < self._interval:
            return False
        self._last_beat = now
        sent_at = datetime.now(UTC)  # before sending: never later than the monitor's receipt
        if not self._send_ft_heartbeat():
            return False
        self._report.heartbeat = sent_at
        self._write(now)
        return True

    def _send_ft_heartbeat(self) -> bool:
        if self._ft is None:
            return False
        try:
            self._ft.send_heartbeat()
        except Exception:  # the launcher is going away; its rank monitor handles the rest
            self._ft = None
            return False
        return True

    # --- hang budgets (in-process restart) ----------------------------------------------------
    def attach_deadline(self, set_deadline: Callable[[float], None], budgets: HangBudgets) -> None:
        """From now (the training function entered: start-up) time the sections against `budgets`
        and call `set_deadline(budget_s)` as they change (rtj_trainer.inprocess, per iteration)."""
        self._sections = SectionClock(budgets, set_deadline, time.monotonic, self._is_unsettled)
        self._overdue = None

    def ceiling_while(self, unsettled: Callable[[], bool]) -> None:
        """Until `unsettled()` returns False, every section's hang budget is the ceiling (the soft
        timeout): one-off background work that slows the steps is not a hang. The memory tier's
        buffers being allocated is one: pinning 13.7 GB stalled a 0.16 s step for over 5 s on 1xH200
        (2026-12-04), which a 5 s learned budget aborted as a hang."""
        self._unsettled = unsettled

    def _is_unsettled(self) -> bool:
        if self._unsettled is None:
            return False
        if self._unsettled():
            return True
        self._unsettled = None
        return False

    def detach_deadline(self) -> None:
        """The training function returned or was aborted; `overdue` keeps what it was then."""
        self._overdue = self.overdue()
        self._sections = None

    def overdue(self) -> tuple[Section, float] | None:
        """(section, budget) when this rank's hang deadline had passed (at the detach, once
        detached): the abort was for its own hang, not a peer's fault."""
        return self._sections.overdue() if self._sections is not None else self._overdue

    @contextlib.contextmanager
    def section(self, kind: Section) -> Iterator[NestedSection]:
        """A section inside a step with its own budget: `Section.CHECKPOINT` around a save (learned
        from the saves), `Section.OTHER` around work of unknown length (the ceiling). Call
        `.discard()` on what it yields when the section turned out to be no sample (nothing saved)."""
        clock = self._sections
        if clock is None:
            yield NestedSection(None)
            return
        clock.begin(kind)
        try:
            yield NestedSection(clock)
        finally:
            if self._sections is clock:
                clock.end()

    # --- events (written at once) -----------------------------------------------------------
    def state(self, state: PodState) -> None:
        if state == PodState.CHECKPOINTING and self._sections is not None:
            self._sections.relax()  # a save of unknown length (an emergency save): the ceiling
        if self._report.state != state:
            self._report.state = state
            self._write()

    def checkpoint_committed(self, step: int, when: datetime | None = None) -> None:
        """A checkpoint of `step` is complete and atomic on storage (call it on every rank)."""
        self._report.checkpoint = CheckpointRef(step=int(step), time=when or datetime.now(UTC))
        self._write()
        self._progress()

    def memory_snapshot(self, step: int) -> None:
        """A node-local memory snapshot of `step` is committed by this rank (or was resumed from)."""
        self._report.memory_snapshot_step = int(step)
        self._write()
        self._progress()

    def replicated(self, step: int) -> None:
        """The peer pod committed its replica of this rank's memory snapshot of `step`."""
        self._report.replica_step = int(step)
        self._write()

    def _progress(self) -> None:
        """The no-progress file: one writer per pod (local rank 0) suffices. It holds the newest
        step a restart can resume from (persisted or in memory), so a restart cycle that brings
        no newer one counts as no progress."""
        report = self._report
        if not self._progress_file or report.local_rank != 0:
            return
        step = max(report.checkpoint.step if report.checkpoint else 0, report.memory_snapshot_step or 0)
        with contextlib.suppress(OSError):
            write_atomic(self._progress_file, f"{int(step)}\n")

    def persisted(self, seconds: float) -> None:
        """This rank wrote its shard of a checkpoint to the volume in `seconds` (the operator sizes
        the pods' grace period for an emergency save from the longest)."""
        self._report.persist_seconds = round(float(seconds), 3)
        self._write()

    def checkpoint_skipped(self) -> None:
        self._report.checkpoints_skipped += 1
        self._write()

    def in_process_restart(self, count: int) -> None:
        """The in-process wrapper re-entered the train function for the `count`-th time."""
        self._report.in_process_restarts = int(count)
        self._report.state = PodState.IN_PROCESS_RESTARTING
        self._write()

    def fault(self, severity: FaultSeverity, reason: str, message: str = "") -> None:
        """`reason`: a contract.FaultReason, or a CamelCase reason of the script's own."""
        self._report.fault = Fault(
            severity=severity, reason=reason[:128], message=message[:1024], time=datetime.now(UTC)
        )
        self._write()
        if severity is FaultSeverity.PERMANENT and self._permanent_path is not None:
            with contextlib.suppress(OSError):  # the rank file has it too, until the next worker
                write_atomic(self._permanent_path, self._report.to_file())

    def finished(self) -> None:
        self.state(PodState.FINISHED)

    def _write(self, now: float | None = None) -> None:
        self._last_write = time.monotonic() if now is None else now
        if self._path is None:
            return
        self._report.step = self._step
        self._report.updated = datetime.now(UTC)
        # Reporting must never break training; the agent sees a stale file instead.
        with contextlib.suppress(OSError):
            write_atomic(self._path, self._report.to_file())
