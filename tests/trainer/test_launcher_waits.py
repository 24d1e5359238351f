"""launcher_main.terminate_groups with real processes: the stopped ranks' process groups are
signalled and waited for only as long as one of them still has a process (NVRx 0.7 slept a fixed
second on every in-job restart)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from rtj_trainer.launcher_main import terminate_groups

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(60)]


def _group(ignore_term: bool) -> subprocess.Popen[bytes]:
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('up', flush=True)\ntime.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def _reap_soon(proc: subprocess.Popen[bytes]) -> None:
    """The launcher reaps its ranks itself; here a thread stands in for it."""
    import threading

    threading.Thread(target=proc.wait, daemon=True).start()


def test_groups_that_end_on_sigterm_are_not_waited_for_a_fixed_second() -> None:
    procs = [_group(ignore_term=False) for _ in range(2)]
    for p in procs:
        _reap_soon(p)
    t0 = time.monotonic()
    terminate_groups([p.pid for p in procs], grace_s=30.0)
    assert time.monotonic() - t0 < 15.0  # it returned once they were gone, not at the 30 s grace
    assert all(p.wait(5) == -15 for p in procs)


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    proc = _group(ignore_term=True)
    _reap_soon(proc)
    t0 = time.monotonic()
    terminate_groups([proc.pid], grace_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert proc.wait(5) == -9
