"""rtj_trainer.graceful in a real process: a SIGTERM that the entrypoint marked as the pod's own stop
is held for the emergency save (and given up after its timer, or at the pod's deadline if that comes
first); an unmarked SIGTERM (ft_launcher stopping the survivors for an in-job restart) ends the rank
at once, as before the handler; a rank whose save began but never ends goes at its deadline; the
ranks of pods that got no signal agree on the signalled pod's deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rtj.contract import ExitCode
from rtj_trainer.runtime_env import GRACEFUL_STOP_EXIT_MARGIN_S, GRACEFUL_STOP_FILE, write_graceful_stop

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(120)]

RANK = """
import sys, time
from rtj_trainer.graceful import GracefulStop
stop = GracefulStop.install(give_up_after_s=2.0, status_dir=sys.argv[1])
print("ready", flush=True)
while not stop.requested:
    time.sleep(0.01)
print("stop requested, deadline", stop.deadline, flush=True)
if sys.argv[2] == "hang-in-save":
    stop.saving()  # the save begins ... and never ends (a collective after it that never returns)
time.sleep(60)  # a save that never starts: the give-up timer must end the process
"""


def _rank(status_dir: Path, mode: str = "no-save") -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", RANK, str(status_dir), mode], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _deadline_read(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("stop requested, deadline "), line
    return line.removeprefix("stop requested, deadline ")


def test_unmarked_sigterm_ends_the_rank_at_once(tmp_path: Path) -> None:
    proc = _rank(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM
    assert time.monotonic() - t0 < 1.0


def test_marked_sigterm_is_held_for_the_save_then_given_up_after_the_timer(tmp_path: Path) -> None:
    (tmp_path / GRACEFUL_STOP_FILE).touch()  # what an entrypoint without deadlines wrote
    proc = _rank(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert _deadline_read(proc) == "None"
    assert proc.wait(20) == ExitCode.TERMINATED
    assert 1.5 < time.monotonic() - t0 < 15


@pytest.mark.parametrize("mode", ["no-save", "hang-in-save"])
def test_a_rank_is_gone_by_the_pods_deadline(tmp_path: Path, mode: str) -> None:
    proc = _rank(tmp_path, mode)
    deadline = time.time() + 0.8  # sooner than the 2 s give-up timer
    write_graceful_stop(str(tmp_path), deadline)  # what the entrypoint writes before forwarding
    proc.send_signal(signal.SIGTERM)
    assert float(_deadline_read(proc)) == deadline
    assert proc.wait(20) == ExitCode.TERMINATED
    assert time.time() <= deadline + GRACEFUL_STOP_EXIT_MARGIN_S  # before the launcher's SIGKILL


AGREEING_RANK = """
import os, sys, time
import torch.distributed as dist
from rtj_trainer.graceful import GracefulStop
status_dir, store, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
stop = GracefulStop.install(status_dir=status_dir)
print("ready", flush=True)
while not stop.agreed():  # one all-reduce a step, as in training
    time.sleep(0.01)
print("stop agreed, deadline", stop.deadline, flush=True)
# As a stopping rank does (os._exit): an interpreter exit with gloo's threads still running can
# end in std::terminate (SIGABRT), seen once in CI.
os._exit(0)
"""


def test_the_ranks_of_an_unsignalled_pod_agree_on_the_signalled_pods_deadline(tmp_path: Path) -> None:
    pods = [tmp_path / "pod-0", tmp_path / "pod-1"]
    ranks = []
    for rank, status_dir in enumerate(pods):
        status_dir.mkdir()
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", AGREEING_RANK, str(status_dir), str(tmp_path / "store"), str(rank)],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        for proc in ranks:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.time() + 30
        write_graceful_stop(str(pods[1]), deadline)  # only pod 1 is drained
        ranks[1].send_signal(signal.SIGTERM)
        for proc in ranks:
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0, out
            (line,) = [x for x in out.splitlines() if x.startswith("stop agreed")]
            assert float(line.removeprefix("stop agreed, deadline ")) == pytest.approx(deadline, abs=1e-3)
    finally:
        for proc in ranks:
            proc.kill()
