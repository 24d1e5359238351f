"""The graceful stop's deadline, from the entrypoint to the ranks: the deadline it computes from the
pod's graceful-stop seconds, the GRACEFUL_STOP_FILE it writes, and how a rank parses that file
(a file without a deadline is a graceful stop all the same; the parser never raises)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rtj.builders import graceful_stop_seconds as pod_graceful_stop_seconds
from rtj_trainer.entrypoint import (
    HANDOFF_EXIT_SECONDS,
    handoff_deadline,
    launcher_term_timeout,
    ranks_deadline,
)
from rtj_trainer.runtime_env import (
    GRACEFUL_STOP_EXIT_MARGIN_S,
    GRACEFUL_STOP_FILE,
    stop_deadline,
    write_graceful_stop,
)

pytestmark = pytest.mark.unit


def test_the_deadline_file_round_trips_and_leaves_no_temporary(tmp_path: Path) -> None:
    write_graceful_stop(str(tmp_path), 1_733_400_012.375)
    assert [p.name for p in tmp_path.iterdir()] == [GRACEFUL_STOP_FILE]
    assert stop_deadline((tmp_path / GRACEFUL_STOP_FILE).read_text()) == 1_733_400_012.375
    write_graceful_stop(str(tmp_path), 1_733_400_099.0)  # a second signal: the newer deadline
    assert stop_deadline((tmp_path / GRACEFUL_STOP_FILE).read_text()) == 1_733_400_099.0


@pytest.mark.parametrize(
    ("text", "deadline"),
    [
        pytest.param('{"deadline": 1733400012}', 1733400012.0, id="whole-seconds"),
        pytest.param("", None, id="empty-as-an-older-entrypoint-touched-it"),
        pytest.param("not json", None, id="garbage"),
        pytest.param('{"deadline": 17334', None, id="cut-short"),
        pytest.param("{}", None, id="no-deadline-key"),
        pytest.param("[1733400012]", None, id="a-list"),
        pytest.param("1733400012", None, id="a-bare-number"),
        pytest.param('{"deadline": "1733400012"}', None, id="a-string"),
        pytest.param('{"deadline": true}', None, id="a-bool"),
        pytest.param('{"deadline": null}', None, id="null"),
        pytest.param('{"deadline": NaN}', None, id="nan"),
        pytest.param('{"deadline": Infinity}', None, id="infinity"),
        pytest.param('{"deadline": 1e999}', None, id="overflow"),
    ],
)
def test_a_rank_reads_the_deadline_or_none(text: str, deadline: float | None) -> None:
    assert stop_deadline(text) == deadline


@pytest.mark.parametrize(
    ("graceful_stop_seconds", "term_timeout"),
    [(30, 25), (10, 5), (10.9, 5), (6, 1), (5, 1), (1, 1)],
)
def test_the_ranks_deadline_is_the_launchers_kill_less_the_exit_margin(
    graceful_stop_seconds: float, term_timeout: int
) -> None:
    assert launcher_term_timeout(graceful_stop_seconds) == term_timeout
    signalled = 1_733_400_000.5
    kill = signalled + term_timeout  # ft_launcher's SIGKILL of the ranks, at the earliest
    assert ranks_deadline(signalled, graceful_stop_seconds) == kill - GRACEFUL_STOP_EXIT_MARGIN_S


@pytest.mark.parametrize("grace", [10, 15, 30, 300])
def test_a_handed_off_persist_runs_until_just_before_the_kubelets_kill(grace: int) -> None:
    """The pod's grace period as the operator builds it: the ranks must be gone by their deadline,
    the entrypoint persists what they handed off until HANDOFF_EXIT_SECONDS before the kubelet's
    SIGKILL, which is most of the grace (15 s: 13 s, against the ranks' 4)."""
    signalled = 1_733_400_000.5
    stop_s = pod_graceful_stop_seconds(grace)
    until = handoff_deadline(signalled, stop_s, grace)
    assert until == signalled + grace - HANDOFF_EXIT_SECONDS
    assert until > ranks_deadline(signalled, stop_s)
    # Not knowing the pod's grace period (an entrypoint run by hand): until before its own kill.
    assert handoff_deadline(signalled, stop_s, None) == signalled + stop_s - HANDOFF_EXIT_SECONDS


def test_the_entrypoint_imports_torch_only_when_a_stop_hands_it_a_persist() -> None:
    """The pod's main process stays light for the whole run (no torch in it): the handed-off
    persist's module (`checkpoint.handoff`, which needs torch) is imported from the SIGTERM on."""
    import subprocess
    import sys

    code = "import sys, rtj_trainer.entrypoint; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out
