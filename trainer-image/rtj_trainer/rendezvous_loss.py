"""A lost rendezvous is the job's fault, not this pod's: start ft_launcher again in the same pod.

When the job's rendezvous pod dies, every worker's ft_launcher loses its store within a second and
exits 1 ("Agent run ended with exception, e=DistNetworkError(...)"; RendezvousConnectionError
when it happens while joining). Before, every worker pod then exited 70 and the operator recreated
all of them (issue 13, case 1). The pod itself is healthy: its entrypoint now waits until the
recreated rendezvous accepts connections and starts ft_launcher again, keeping the pod's node, its
GPUs (which a recreated pod might not get back on a full cluster) and its /dev/shm memory
snapshots. The relaunched workers rejoin like an in-job restart (the heartbeat counts one).

Bounded: at most `max_relaunches()` per pod, and only while the rendezvous comes back within
`WAIT_SECONDS`; otherwise the pod exits 70 as before and the operator's ladder takes over.
"""

from __future__ import annotations

import os
import socket
import threading
import time

# How ft_launcher ends when its rendezvous store went away (its last words): LOST_STORE, kept with the
# other upstream text we rely on (nvrx_patches, under its canary).
from .nvrx_patches import LOST_STORE

#: Relaunches per pod after a lost rendezvous (env override, e.g. 0 to turn them off).
ENV_RELAUNCHES = "RTJ_RENDEZVOUS_RELAUNCHES"
DEFAULT_RELAUNCHES = 3
#: How long to wait for the recreated rendezvous to accept connections.
WAIT_SECONDS = 120.0


def max_relaunches(environ: dict[str, str] | os._Environ[str] = os.environ) -> int:
    try:
        return max(0, int(environ.get(ENV_RELAUNCHES, DEFAULT_RELAUNCHES)))
    except ValueError:
        return DEFAULT_RELAUNCHES


class LostStoreWatch:
    """Told every launcher log line (NoiseFilter's observer); remembers whether the store was lost."""

    def __init__(self) -> None:
        self.lost = False

    def __call__(self, line: bytes) -> None:
        if not self.lost and LOST_STORE.search(line):
            self.lost = True


def endpoint_reachable(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether `host:port` accepts a TCP connection now."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def wait_for_rendezvous(endpoint: str, stop: threading.Event, timeout: float = WAIT_SECONDS) -> bool:
    """Wait until the rendezvous accepts connections; False when `stop` is set or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if endpoint_reachable(endpoint):
            return True
        stop.wait(1.0)
    return False
