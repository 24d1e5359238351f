"""Process helpers, stdlib only (the rank forkserver's client imports this and must stay light)."""

from __future__ import annotations

import os
import subprocess


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
