"""Process helpers, stdlib only (the rank forkserver's client imports this and must stay light)."""

from __future__ import annotations

import ctypes
import os
import subprocess

#: <linux/prctl.h>: the signal a process gets when the thread that started it exits.
PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM `proc` (it may clean up), SIGKILL it if it is still there after `grace_s`; reaped."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def die_with_parent(sig: int, parent: int | None = None) -> bool:
    """Have the kernel send this process `sig` when the thread that started it exits
    (PR_SET_PDEATHSIG). False if that parent is already gone: `parent` (its pid, passed by it) is
    no longer this process's parent, or without it the parent changed during the call."""
    before = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    return os.getppid() == (before if parent is None else parent)
