"""rtj_trainer.graceful in a real process: a SIGTERM that the entrypoint marked as the pod's own stop
is held for the emergency save (and given up after its timer); an unmarked SIGTERM (ft_launcher
stopping the survivors for an in-job restart) ends the rank at once, as before the handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rtj.contract import ExitCode
from rtj_trainer.runtime_env import GRACEFUL_STOP_FILE

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

RANK = """
import sys, time
from rtj_trainer.graceful import GracefulStop
stop = GracefulStop.install(give_up_after_s=2.0, status_dir=sys.argv[1])
print("ready", flush=True)
while not stop.requested:
    time.sleep(0.01)
print("stop requested", flush=True)
time.sleep(60)  # a save that never starts: the give-up timer must end the process
"""


def _rank(status_dir: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(status_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_unmarked_sigterm_ends_the_rank_at_once(tmp_path: Path) -> None:
    proc = _rank(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    assert time.monotonic() - t0 < 1.0


def test_marked_sigterm_is_held_for_the_save_then_given_up_after_the_timer(tmp_path: Path) -> None:
    (tmp_path / GRACEFUL_STOP_FILE).touch()  # what the entrypoint writes before forwarding
    proc = _rank(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stop requested"
    assert proc.wait(20) == ExitCode.TERMINATED
    assert 1.5 < time.monotonic() - t0 < 15
