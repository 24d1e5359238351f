"""One ft_launcher process tree under the pod's entrypoint: waiting for it to exit, stopping it (on an
overdue graceful stop, a rank's permanent error, a fence, or a launcher that lingers after every rank
finished), killing it with every rank it left behind, and a hot spare's promotion handshake."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable

import psutil
from rtj.contract import Fault, FaultSeverity, Heartbeat, PodState, RankReport

from .heartbeat import HeartbeatAgent, read_rank_files
from .runtime_env import PERMANENT_FILE_PREFIX
from .warm_launcher import GO

log = logging.getLogger("rtj_trainer")


class ExitWatch:
    """Notices a launcher that does not exit although all of its ranks finished.

    A launcher waiting on its rank-monitor subprocesses (seen under heavy CPU load) would otherwise
    keep a finished pod from ever completing.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.fired = False
        self._since: float | None = None

    def launcher_stuck(self, hb: Heartbeat | None, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if hb is None or hb.state != PodState.FINISHED:
            self._since = None
            return False
        self._since = self._since if self._since is not None else now
        if not self.fired and now - self._since >= self.timeout:
            self.fired = True
            return True
        return False


def reported_permanent_fault(reports: Iterable[RankReport]) -> Fault | None:
    """A Permanent fault some rank reported in its rank file, else None (pure; unit-tested)."""
    return next(
        (r.fault for r in reports if r.fault is not None and r.fault.severity is FaultSeverity.PERMANENT),
        None,
    )


def permanent_fault_in(status_dir: str) -> Fault | None:
    """A Permanent fault some rank of the pod reported: in its rank file, or in the copy kept for it
    (PERMANENT_FILE_PREFIX) once ft_launcher's next worker of that rank rewrote the rank file: that
    can happen between two polls (a restart from the warm forkserver takes a fraction of one)."""
    kept = read_rank_files(status_dir, PERMANENT_FILE_PREFIX)
    return reported_permanent_fault([*kept, *read_rank_files(status_dir)])


def supervise(
    proc: subprocess.Popen[bytes],
    agent: HeartbeatAgent,
    exit_watch: ExitWatch,
    terminate: threading.Event,
    status_dir: str,
    graceful_stop_seconds: float,
) -> tuple[int, Fault | None]:
    """Wait for the launcher to exit; kill it on an overdue graceful stop, a rank's permanent error
    (returned) or a launcher that lingers after every rank finished."""
    kill_deadline: float | None = None
    permanent: Fault | None = None
    while True:
        try:
            return proc.wait(timeout=0.5), permanent
        except subprocess.TimeoutExpired:
            pass
        if agent.fenced.is_set():
            kill_group(proc)  # at once: a stale incarnation must neither train nor save
        if terminate.is_set():
            kill_deadline = kill_deadline or time.monotonic() + graceful_stop_seconds
            if time.monotonic() >= kill_deadline:
                log.warning("graceful stop past %.0f s: killing the launcher", graceful_stop_seconds)
                kill_group(proc)
        if permanent is None and not terminate.is_set():
            # Read each poll, not at the heartbeat interval: ft_launcher restarts the workers within
            # a second or two, and every restart would meet the same error.
            permanent = permanent_fault_in(status_dir)
            if permanent is not None:
                log.error(
                    "a rank reported a permanent error (%s: %s): stopping ft_launcher, no restart can fix it",
                    permanent.reason,
                    permanent.message,
                )
                kill_group(proc)
        if exit_watch.launcher_stuck(agent.last):
            log.warning(
                "every rank finished %.0f s ago but ft_launcher has not exited: killing it",
                exit_watch.timeout,
            )
            kill_group(proc)


def await_promotion(
    agent: HeartbeatAgent,
    proc: subprocess.Popen[bytes],
    terminate: threading.Event,
    on_promoted: Callable[[int | None], object] | None = None,
) -> None:
    """Block until the operator assigns a slot, then (`on_promoted(slot)` first) let the warm
    launcher go. A stop (or the warm launcher's death) first: it ends without launching, and the
    caller's loop sees it exit."""
    assert proc.stdin is not None
    waited = time.monotonic()
    while not agent.promoted.wait(0.1):
        if terminate.is_set() or proc.poll() is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            return
    if on_promoted is not None:
        slot = agent.assigned_slot
        on_promoted(int(slot) if slot is not None and slot.isdigit() else None)
    with contextlib.suppress(OSError):  # BrokenPipe: it died just now; the caller's loop sees that
        proc.stdin.write(f"{GO}\n".encode())
        proc.stdin.close()
    log.info(
        "standby: node slot %s assigned after %.1f s: ft_launcher joins the rendezvous",
        agent.assigned_slot,
        time.monotonic() - waited,
    )


def signal_launcher(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def kill_group(proc: subprocess.Popen[bytes], keep: int | None = None) -> None:
    """SIGKILL the launcher and everything below it, and every other descendant but `keep` (the
    rank fork server, which serves the next launcher; the ranks it forked are killed).

    ft_launcher starts each rank in its own session, so the launcher's process group is not
    enough; as a child subreaper this process also inherits ranks orphaned by a dead launcher.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return
    children = [c for c in children if c.pid != keep]
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(children, timeout=5)


def become_subreaper() -> None:
    """Orphaned ranks are re-parented to this process instead of init (Linux only)."""
    with contextlib.suppress(Exception):
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
