"""rtj_trainer.rendezvous_loss: which launcher endings are a lost rendezvous, the relaunch budget,
and the wait for the recreated rendezvous (a real socket on localhost)."""

from __future__ import annotations

import io
import os
import socket
import threading

import pytest
from rtj_trainer.log_filter import NoiseFilter
from rtj_trainer.rendezvous_loss import (
    DEFAULT_RELAUNCHES,
    ENV_RELAUNCHES,
    LostStoreWatch,
    endpoint_reachable,
    max_relaunches,
    wait_for_rendezvous,
)

pytestmark = pytest.mark.unit

#: ft_launcher's last line after its store died (NVRx 0.7, seen in tests/trainer).
LOST = (
    b"2026-12-01 01:10:16,804 [ERROR] [vm] launcher.py:3750 Agent run ended with exception, "
    b"e=DistNetworkError('Failed to recv, got 0 bytes. Connection was likely closed.'). "
    b"Agent's exit code = 1\n"
)


@pytest.mark.parametrize(
    ("line", "lost"),
    [
        (LOST, True),
        (
            b"... Agent run ended with exception, e=RendezvousConnectionError('The connection to the C10d "
            b"store has failed.'). Agent's exit code = 1\n",
            True,
        ),
        # A rank's own failure or a spent budget is not a lost rendezvous.
        (
            b"... Some rank(s) exited with non-zero exit code: {1: ProcessFailure(...)}. "
            b"Agent's exit code = 1\n",
            False,
        ),
        (b"... Agent run ended with exception, e=ValueError('bad arg'). Agent's exit code = 1\n", False),
        (b"[rank0]: RuntimeError: DistNetworkError in a rank's collective\n", False),
    ],
)
def test_which_launcher_endings_are_a_lost_rendezvous(line: bytes, lost: bool) -> None:
    watch = LostStoreWatch()
    watch(line)
    assert watch.lost is lost


def test_the_log_filter_shows_every_passed_line_to_the_watch() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "wb") as writer:
        writer.write(b"starting\n" + LOST)
    watch = LostStoreWatch()
    with os.fdopen(r, "rb") as reader:
        NoiseFilter(reader, io.BytesIO(), observe=watch).start().join(timeout=10)
    assert watch.lost


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, DEFAULT_RELAUNCHES), ("0", 0), ("5", 5), ("-2", 0), ("many", DEFAULT_RELAUNCHES)],
)
def test_relaunch_budget(value: str | None, expected: int) -> None:
    assert max_relaunches({} if value is None else {ENV_RELAUNCHES: value}) == expected


def test_wait_for_rendezvous_returns_once_it_listens_and_gives_up_on_stop() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        endpoint = f"127.0.0.1:{port}"
        assert not endpoint_reachable(endpoint)  # bound, not listening: refused
        stop = threading.Event()
        stop.set()
        assert not wait_for_rendezvous(endpoint, stop, timeout=5)
        server.listen()
        assert wait_for_rendezvous(endpoint, threading.Event(), timeout=5)
