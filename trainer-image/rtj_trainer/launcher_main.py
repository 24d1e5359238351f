"""ft_launcher as `python -m`, with the job's rendezvous kept open when this launcher leaves.

    python -m rtj_trainer.launcher_main <ft_launcher arguments...>

Everything but `keep_rendezvous_open` and `restart_without_fixed_waits` is NVRx's launcher, run
as __main__.
"""

from __future__ import annotations

import logging
import os
import runpy
import signal
import sys
import time
from typing import Any

LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"

log = logging.getLogger(__name__)


def keep_rendezvous_open() -> None:
    """Make this process's ft_launcher leave the job's rendezvous without shutting it down.

    On exit, NVRx's launcher shuts the rendezvous down for good (`FtRendezvousBarrierHandler.shutdown`,
    also on a failure once its restart budget is spent), and every later joiner fails at once with
    RendezvousClosedError: the pod the operator starts in this one's place could never join, and the
    job would die with the one pod. Here the rendezvous outlives any pod (the job's rendezvous pod
    hosts it) and the operator decides the job's end, so a leaving launcher only removes itself.

    Leaving after a failure, it opens the next round instead, as a launcher that restarts would: the
    survivors restart their workers into it, and the replacement pods can join it even when every
    launcher of the job has left (a round nobody opens is never closed, and joiners wait forever).
    NVRx's own "do not restart" broadcast (`signal_no_restart`, no progress) is a different call and
    still reaches every launcher.
    """
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import FtRendezvousBarrierHandler
    from nvidia_resiliency_ext.fault_tolerance.utils import RDZV_SHUTDOWN_REASON_FAILURE

    def _leave_open(self: Any, reason: str = "") -> bool:
        if reason == RDZV_SHUTDOWN_REASON_FAILURE:
            try:
                self._barrier_state.open_rendezvous()
            except Exception as exc:  # the store may be gone too; the operator recreates it
                log.warning("could not open the next rendezvous round: %s", exc)
        log.info("launcher leaving (%s): the rendezvous stays open for its replacement", reason or "done")
        return True

    FtRendezvousBarrierHandler.shutdown = _leave_open  # type: ignore[method-assign]


#: How long stopped ranks' process groups get between SIGTERM and SIGKILL (NVRx: a fixed 1 s sleep).
GROUP_TERM_GRACE_S = 1.0


def terminate_groups(allowed_pgids: Any, grace_s: float = GROUP_TERM_GRACE_S) -> None:
    """NVRx's `terminate_mp_processes` (the last step of stopping the ranks, on every in-job
    restart), but it returns as soon as the groups are empty instead of sleeping a fixed second:
    SIGTERM, wait up to `grace_s` for the groups to empty, SIGKILL what is left."""
    pgids = [g for g in allowed_pgids if g != 1]  # NVRx's own guard (its rank monitors' group)
    if len(pgids) != len(allowed_pgids):
        return
    for pgid in pgids:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (alive := [g for g in pgids if _signal_group(g, 0)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    for pgid in alive:
        _signal_group(pgid, signal.SIGKILL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Whether the group still had a process (signal 0 only checks)."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def restart_without_fixed_waits() -> None:
    """Two fixed one-second waits of every in-job restart of NVRx 0.7, removed (issue 14):

    - after stopping the ranks, `terminate_mp_processes` sleeps 1 s even when every rank is gone
      (`terminate_groups` above waits only while one is left);
    - a launcher that restarts its workers enters the rendezvous's Step 0 still on the round that
      failed: it sees that round closed, then syncs to the round its failure opened, then sleeps
      1 s before it looks again. Syncing first (what that loop's own first check does) finds the
      new round open at once.
    """
    from nvidia_resiliency_ext.fault_tolerance import utils
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    # The launcher runs as __main__ (runpy) and imports the name from utils then: patch it there.
    utils.terminate_mp_processes = terminate_groups
    wait_open = _RendezvousBarrierState._wait_for_rendezvous_open

    def _sync_then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._sync_from_per_round_state()
        return wait_open(self, *args, **kwargs)

    _RendezvousBarrierState._wait_for_rendezvous_open = _sync_then_wait  # type: ignore[method-assign]


def run_launcher(argv: list[str]) -> None:
    """Run NVRx's launcher in this interpreter with `argv`; exits with the launcher's code."""
    keep_rendezvous_open()
    restart_without_fixed_waits()
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_launcher(sys.argv[1:])
