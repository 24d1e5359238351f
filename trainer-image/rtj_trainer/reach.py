"""The pod's reach responder and the peer probe behind partition detection.

A job stuck recovering may be split by the network: every pod heartbeats to the API server, yet some
cannot reach each other, and the rendezvous waits forever. The operator cannot see that from the
Leases alone, so it asks the pods (contract.REACH_PROBE_ANNOTATION on each pod's Lease: a probe id
and the reach endpoints of some peers, by slot) and weighs who reached whom.

    pod of slot s (heartbeat agent)                      pod of slot t
    probe({t: "10.0.0.7:41234", ...}) -- TCP connect -->  ReachResponder (a thread of `rtj-trainer launch`)
                                     <-- REACH_BANNER --  sends it, closes
    reached [t] / unreachable [...]  -> Heartbeat.reach (contract.ReachReport, same probe id)

The responder sends a banner rather than only accepting: a peer that reads it has a path both ways,
not only a TCP handshake. It listens on an ephemeral port (pods of the local cluster share one
host, so a fixed port could clash) and each pod publishes its endpoint in Heartbeat.reachEndpoint.

A probe tries every peer at once, one thread each (at most contract.REACH_MAX_PEERS), under one
deadline: its wall time is about one timeout however many peers are silent. Anything but the banner
within the timeout (refused, timed out, a name that does not resolve, other bytes, an endpoint that
is not host:port) counts as unreachable. Hand-written on the standard library (sockets, threads);
nothing here may crash the entrypoint.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

from rtj.contract import REACH_BANNER, REACH_PROBE_TIMEOUT_SECONDS

log = logging.getLogger(__name__)

#: How often the responder's accept loop looks at its stop flag.
_ACCEPT_POLL_SECONDS = 0.5


def join_endpoint(host: str, port: int) -> str:
    """host:port, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of "host:port" or "[v6]:port"; ValueError when it is neither."""
    host, _, port = endpoint.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host, int(port)


class ReachResponder:
    """A daemon thread answering every TCP connection with REACH_BANNER, then closing it."""

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self._sock = socket.create_server((host, port))
        self._sock.settimeout(_ACCEPT_POLL_SECONDS)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rtj-reach-responder", daemon=True)
        self._thread.start()

    def endpoint(self, host: str) -> str:
        """What peers dial: `host` (the pod's IP) and this responder's port."""
        return join_endpoint(host, self.port)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # e.g. out of file descriptors: keep serving
                if self._stop.is_set():
                    return
                log.warning("reach responder: accept failed: %r", exc)
                self._stop.wait(_ACCEPT_POLL_SECONDS)
                continue
            try:
                with conn:
                    conn.settimeout(REACH_PROBE_TIMEOUT_SECONDS)
                    conn.sendall(REACH_BANNER)
            except OSError:  # the prober gave up or went away: its loss, not ours
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2 * _ACCEPT_POLL_SECONDS)
        with contextlib.suppress(OSError):
            self._sock.close()


def start_responder(pod_ip: str | None) -> ReachResponder | None:
    """The pod's responder, or None (logged) when the pod has no IP (no endpoint to publish) or the
    socket cannot be opened: the pod then simply reads as unreachable to its peers."""
    if not pod_ip:
        log.info("no pod IP (downward API status.podIP): no reach responder")
        return None
    try:
        return ReachResponder()
    except OSError as exc:
        log.error("reach responder not started (%r): peers will find this pod unreachable", exc)
        return None


def _answers(endpoint: str, deadline: float) -> bool:
    """Whether `endpoint` sends REACH_BANNER before `deadline` (time.monotonic())."""
    try:
        host, port = split_endpoint(endpoint)
        with socket.create_connection((host, port), timeout=max(0.0, deadline - time.monotonic())) as sock:
            got = b""
            while len(got) < len(REACH_BANNER):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                sock.settimeout(left)
                chunk = sock.recv(len(REACH_BANNER) - len(got))
                if not chunk:
                    break
                got += chunk
            return got == REACH_BANNER
    except (OSError, ValueError):  # refused, timed out, unresolvable, malformed
        return False


def probe(peers: dict[int, str], timeout: float = REACH_PROBE_TIMEOUT_SECONDS) -> tuple[list[int], list[int]]:
    """(reached, unreachable): the slots of `peers` whose endpoint sent REACH_BANNER within
    `timeout`, and the others, each sorted. All peers at once: about one timeout in all."""
    deadline = time.monotonic() + timeout
    answered: dict[int, bool] = {}

    def attempt(slot: int, endpoint: str) -> None:
        answered[slot] = _answers(endpoint, deadline)

    threads = [
        threading.Thread(target=attempt, args=(slot, endpoint), name=f"rtj-reach-probe-{slot}", daemon=True)
        for slot, endpoint in peers.items()
    ]
    for t in threads:
        t.start()
    for t in threads:  # a thread stuck in name resolution is left behind, counted unreachable
        t.join(max(0.0, deadline - time.monotonic()) + 0.1)
    ok = dict(answered)  # one reading: a thread left behind may still write
    return sorted(s for s in peers if ok.get(s)), sorted(s for s in peers if not ok.get(s))
