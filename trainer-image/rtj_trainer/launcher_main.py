"""ft_launcher as `python -m`, with the job's rendezvous kept open when this launcher leaves.

    python -m rtj_trainer.launcher_main <ft_launcher arguments...>

NVRx's launcher, run as __main__ with the patches of `nvrx_patches` applied: a leaving launcher keeps
the rendezvous open for its replacement, and an in-job restart waits for nothing that is already done
(`terminate_groups` here, and no fixed second in the rendezvous's Step 0).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from collections.abc import Collection

from . import nvrx_patches
from .nvrx_patches import LAUNCHER_MODULE

#: How long stopped ranks' process groups get between SIGTERM and SIGKILL (NVRx: a fixed 1 s sleep).
GROUP_TERM_GRACE_S = 1.0


def terminate_groups(allowed_pgids: Collection[int], grace_s: float = GROUP_TERM_GRACE_S) -> None:
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


def run_launcher(argv: list[str]) -> None:
    """Run NVRx's launcher in this interpreter with `argv`; exits with the launcher's code."""
    nvrx_patches.apply_keep_rendezvous_open()
    nvrx_patches.apply_group_termination(terminate_groups)
    nvrx_patches.apply_sync_before_rendezvous_wait()
    sys.argv = [sys.argv[0], *argv]
    runpy.run_module(LAUNCHER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    run_launcher(sys.argv[1:])
