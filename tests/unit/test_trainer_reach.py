"""Reachability probes, the trainer side of partition detection (rtj_trainer.reach): the pod's
responder and the peer probe, on real sockets and threads; and the heartbeat agent taking a probe
request from its Lease and publishing the answer at once. The Lease is a recording fake
(tests/unit/test_standby_promotion_logic.py has the same)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from rtj.contract import (
    HEARTBEAT_ANNOTATION,
    REACH_BANNER,
    REACH_MAX_PEERS,
    REACH_PROBE_ANNOTATION,
    Heartbeat,
    ReachProbe,
    ReachReport,
    parse_heartbeat,
)
from rtj_local.wait import wait_for
from rtj_trainer import heartbeat
from rtj_trainer.heartbeat import HeartbeatAgent, PodIdentity
from rtj_trainer.reach import ReachResponder, join_endpoint, probe, split_endpoint, start_responder

pytestmark = pytest.mark.unit

TIMEOUT = 0.5


@pytest.fixture
def responder() -> Iterator[ReachResponder]:
    r = ReachResponder()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def dead_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent() -> Iterator[str]:
    """A listener that completes handshakes (the kernel's backlog) but never sends the banner."""
    with socket.create_server(("127.0.0.1", 0)) as s:
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_a_responder_sends_the_banner_on_every_connection_and_is_reached(responder: ReachResponder) -> None:
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", responder.port), timeout=5) as sock:
            assert sock.recv(64) == REACH_BANNER
    assert probe({3: responder.endpoint("127.0.0.1")}) == ([3], [])


def test_a_closed_port_is_unreachable(dead_port: int) -> None:
    assert probe({1: f"127.0.0.1:{dead_port}"}, TIMEOUT) == ([], [1])


def test_a_closed_responder_is_unreachable() -> None:
    r = ReachResponder()
    endpoint = r.endpoint("127.0.0.1")
    r.close()
    assert probe({0: endpoint}, TIMEOUT) == ([], [0])


def test_a_listener_that_never_sends_the_banner_is_unreachable_within_the_timeout(silent: str) -> None:
    started = time.monotonic()
    assert probe({2: silent}, TIMEOUT) == ([], [2])
    assert TIMEOUT * 0.8 <= time.monotonic() - started < 3 * TIMEOUT


def test_other_bytes_than_the_banner_are_unreachable() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:

        def answer_wrong() -> None:
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n")

        t = threading.Thread(target=answer_wrong, daemon=True)
        t.start()
        assert probe({4: f"127.0.0.1:{server.getsockname()[1]}"}, TIMEOUT) == ([], [4])
        t.join(5)


@pytest.mark.parametrize(
    "endpoint",
    ["no-port", "127.0.0.1:", ":29400", "127.0.0.1:http", "127.0.0.1:0", "127.0.0.1:99999", ""],
)
def test_a_malformed_endpoint_is_unreachable(endpoint: str) -> None:
    assert probe({5: endpoint}, TIMEOUT) == ([], [5])


def test_peers_are_probed_at_once_not_one_timeout_after_another(
    silent: str, responder: ReachResponder
) -> None:
    peers = dict.fromkeys(range(REACH_MAX_PEERS), silent) | {REACH_MAX_PEERS: responder.endpoint("127.0.0.1")}
    started = time.monotonic()
    reached, unreachable = probe(peers, TIMEOUT)
    assert time.monotonic() - started < 3 * TIMEOUT, "8 silent peers must cost about one timeout, not 8"
    assert (reached, unreachable) == ([REACH_MAX_PEERS], list(range(REACH_MAX_PEERS)))


def test_endpoints_name_ipv6_hosts_in_brackets() -> None:
    assert join_endpoint("10.0.0.7", 41234) == "10.0.0.7:41234"
    assert join_endpoint("fd00::7", 41234) == "[fd00::7]:41234"
    assert split_endpoint("[fd00::7]:41234") == ("fd00::7", 41234)
    assert split_endpoint("10.0.0.7:41234") == ("10.0.0.7", 41234)


def test_no_pod_ip_no_responder() -> None:
    assert start_responder(None) is None
    assert start_responder("") is None


# --- the heartbeat agent ---------------------------------------------------------------------------


class FakeLeaseStore:
    """Stands in for the API server's Lease: merge-patches the heartbeat annotation in, returns all."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.annotations = dict(annotations)
        self.written: list[Heartbeat] = []
        self._lock = threading.Lock()

    def write(self, hb: Heartbeat, now: datetime) -> dict[str, str]:
        with self._lock:
            self.written.append(hb)
            self.annotations[HEARTBEAT_ANNOTATION] = hb.to_annotation()
            return dict(self.annotations)

    def heartbeats(self) -> list[Heartbeat]:
        with self._lock:
            return list(self.written)


def test_the_agent_probes_a_new_request_once_and_publishes_the_answer_at_once(
    tmp_path: Path, responder: ReachResponder, dead_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed: list[dict[int, str]] = []
    real_probe = heartbeat.probe

    def counting_probe(peers: dict[int, str]) -> tuple[list[int], list[int]]:
        probed.append(peers)
        return real_probe(peers, TIMEOUT)

    monkeypatch.setattr(heartbeat, "probe", counting_probe)
    request = ReachProbe(id="p1", peers={1: responder.endpoint("127.0.0.1"), 2: f"127.0.0.1:{dead_port}"})
    store = FakeLeaseStore({REACH_PROBE_ANNOTATION: request.to_annotation()})
    own = responder.endpoint("10.0.0.5")
    agent = HeartbeatAgent(
        str(tmp_path), PodIdentity("j-n0-a0", "ns", None), 60.0, None, writer=store, reach_endpoint=own
    )
    agent.start()
    try:
        # The interval is 60 s: only the wake after the probe publishes its answer this soon.
        answered = wait_for(
            lambda: next((hb for hb in store.heartbeats() if hb.reach is not None), None),
            10,
            0.05,
            message="a heartbeat carrying the reach report",
        )
        assert answered.reach is not None
        assert (answered.reach.probe, answered.reach.reached, answered.reach.unreachable) == ("p1", [1], [2])
        # As the operator reads it off the Lease.
        on_lease = parse_heartbeat(store.annotations)
        assert on_lease is not None and on_lease.reach is not None and on_lease.reach.probe == "p1"
        assert on_lease.reach_endpoint == own

        # Renewals that return the same request again probe nothing; the answer stays published.
        agent.tick()
        agent.tick()
        assert len(probed) == 1
        assert store.heartbeats()[-1].reach == answered.reach

        # A new request (a new id) is probed and answered in its turn.
        store.annotations[REACH_PROBE_ANNOTATION] = ReachProbe(
            id="p2", peers={2: f"127.0.0.1:{dead_port}"}
        ).to_annotation()
        agent.tick()

        def answer_to_p2() -> ReachReport | None:
            reach = store.heartbeats()[-1].reach
            return reach if reach is not None and reach.probe == "p2" else None

        second = wait_for(
            answer_to_p2,
            10,
            0.05,
            message="the answer to the second request",
        )
        assert len(probed) == 2 and second.unreachable == [2]
    finally:
        started = time.monotonic()
        agent.stop(None)
    assert time.monotonic() - started < 5, "stop() must wake the agent, not wait out its 60 s interval"
    written = store.heartbeats()
    assert all(hb.reach_endpoint == own for hb in written), "reachEndpoint on every heartbeat"
    assert written[0].reach is None, "no report before a probe was answered"


def test_a_pod_without_a_responder_publishes_no_endpoint(tmp_path: Path) -> None:
    store = FakeLeaseStore({})
    agent = HeartbeatAgent(str(tmp_path), PodIdentity("j-n0-a0", "ns", None), 60.0, None, writer=store)
    hb = agent.tick()
    assert hb.reach_endpoint is None and hb.reach is None
    assert "reachEndpoint" not in store.annotations[HEARTBEAT_ANNOTATION]
