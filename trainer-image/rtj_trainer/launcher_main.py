"""ft_launcher as `python -m`, with the job's rendezvous kept open when this launcher leaves.

    python -m rtj_trainer.launcher_main <ft_launcher arguments...>

Everything but `keep_rendezvous_open` is NVRx's launcher, run as __main__.
"""

from __future__ import annotations

import logging
import runpy
import sys
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


def run_launcher(argv: list[str]) -> None:
    """Run NVRx's launcher in this interpreter with `argv`; exits with the launcher's code."""
    keep_rendezvous_open()
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_launcher(sys.argv[1:])
