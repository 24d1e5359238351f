"""One active operator among replicas: leader election on a Lease in the operator's namespace.

`python -m rtj` (rtj.__main__) runs the election *before* kopf when RTJ_LEADER_ELECTION_LEASE names
the Lease (the chart sets it): a standby blocks there, watching nothing and writing nothing but its
attempts on the Lease, and serves only /healthz (body `{"role": "standby", ...}`) on kopf's liveness
address; once it holds the Lease, kopf starts (watches, indexes, the jobs' passes) as it would alone.

The algorithm is client-go's, through the official client's `kubernetes.leaderelection` (LeaderElection,
LeaseLock): the holder renews every `retry` seconds; a candidate takes the Lease once it has seen the
same record for `lease` seconds on its own clock (never from renewTime: clock skew between nodes does
not matter). What we add, and why:
- **Fencing** (`Fence`): the holder exits the process (os._exit, EXIT_LEADERSHIP_LOST) as soon as
  `renew_deadline` seconds have passed since the *start* of its last successful renewal, checked by a
  thread every FENCE_CHECK_SECONDS and by rtj.kube before each write it sends (`Kube.write_fence`).
  A candidate cannot take the Lease before `lease` seconds after it saw that renewal, which it saw
  after it was sent: the old holder is gone `lease - renew_deadline` seconds before. The library's own
  loop gives up only after a whole renew window *after* a sleep, and a request that hangs (its calls
  carry no timeout) would hold it forever: the fence does not depend on it.
- **Request timeouts**: every call of the lock carries `request_timeout`; an error other than an API
  answer (no connection, a timeout) reads as a failed attempt, not as the end of the election thread.
- **Release on a clean stop**: after kopf returned (SIGTERM: its handlers and loops stopped), the
  Lease's holder is cleared, so the standby takes it on its next attempt instead of after `lease`.

What is not covered: kopf's own writes (its annotations and finalizers on jobs) do not pass the
write fence (the fence thread still ends the process within FENCE_CHECK_SECONDS), and a write that left
the process before the fence fired may reach the API server later (as with client-go).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from rtj import metrics
from rtj.watch_guard import exit_process

logger = logging.getLogger("rtj.leader_election")

#: Exit code of a holder that could not renew within its renew deadline (the Deployment restarts it,
#: as a standby).
EXIT_LEADERSHIP_LOST = 76
#: How often the fence thread checks the renew deadline.
FENCE_CHECK_SECONDS = 0.1


@dataclass(frozen=True)
class ElectionConfig:
    """The Lease (namespace/name) and the election's timing (RTJ_LEADER_ELECTION_* settings)."""

    lease: str
    namespace: str
    identity: str
    lease_seconds: int
    renew_deadline_seconds: float
    retry_seconds: float
    request_timeout_seconds: float

    @staticmethod
    def unique_identity(prefix: str) -> str:
        """`<prefix or hostname>_<random>`: a restarted process never renews its predecessor's term."""
        return f"{prefix or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class _TimedLeases:
    """The three Lease calls LeaseLock makes, each with a timeout; a failure without an API answer
    (connection refused, timeout) raised as an ApiException, which the library reads as a failed
    attempt (any other exception would end its thread)."""

    def __init__(self, api: client.CoordinationV1Api, timeout: float) -> None:
        self.api, self.timeout = api, timeout

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args, _request_timeout=self.timeout)
        except ApiException:
            raise
        except Exception as exc:  # urllib3: no API server answered in time
            raise ApiException(status=0, reason=f"{type(exc).__name__}: {exc}") from exc

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        return self._call(self.api.read_namespaced_lease, name, namespace)

    def create_namespaced_lease(self, namespace: str, body: Any) -> Any:
        return self._call(self.api.create_namespaced_lease, namespace, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any) -> Any:
        return self._call(self.api.replace_namespaced_lease, name, namespace, body)


class FencedLeaseLock(LeaseLock):
    """LeaseLock whose calls time out, which records when its last successful write as holder was
    sent (`renewed_at`, monotonic), and which can release the Lease."""

    def __init__(
        self,
        cfg: ElectionConfig,
        api: client.CoordinationV1Api,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(cfg.lease, cfg.namespace, cfg.identity)
        self.api_instance = _TimedLeases(api, cfg.request_timeout_seconds)
        self.clock = clock
        self.renewed_at: float | None = None
        #: Set before the release: no renewal (nor acquisition) is attempted any more.
        self.stopped = threading.Event()

    def create(self, name: str, namespace: str, election_record: Any) -> bool:
        if self.stopped.is_set():
            return False
        sent = self.clock()
        ok = bool(super().create(name, namespace, election_record))
        if ok:
            self.renewed_at = sent
        return ok

    def update(self, name: str, namespace: str, updated_record: Any) -> bool:
        # The library updates only with its own identity as holder: a success is a renewal (or the
        # acquisition), under the resourceVersion it read (a concurrent writer gets a Conflict).
        if self.stopped.is_set():
            return False
        sent = self.clock()
        ok = bool(super().update(name, namespace, updated_record))
        if ok:
            self.renewed_at = sent
        return ok

    def release(self) -> bool:
        """Stop renewing and clear the holder (if it is still us), so a candidate takes the Lease on
        its next attempt. True if released."""
        self.stopped.set()
        try:
            lease = self.api_instance.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return False
            now = datetime.now(UTC)
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = now
            self.api_instance.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            logger.warning("could not release leader Lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        return True


class Fence:
    """Ends the process once the holder's renew deadline has passed since its last renewal."""

    def __init__(
        self,
        lock: FencedLeaseLock,
        renew_deadline: float,
        exit_with: Callable[[int], Any] = exit_process,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock, self.renew_deadline, self.exit_with, self.clock = lock, renew_deadline, exit_with, clock
        self._thread: threading.Thread | None = None

    def expired(self) -> bool:
        renewed = self.lock.renewed_at
        return renewed is None or self.clock() - renewed > self.renew_deadline

    def check(self) -> None:
        """rtj.kube calls this before each write it sends: a holder past its deadline sends none."""
        if self.expired() and not self.lock.stopped.is_set():
            renewed = self.lock.renewed_at
            since = "never" if renewed is None else f"{self.clock() - renewed:.1f}s ago"
            logger.error(
                "leader Lease %s/%s not renewed within %.1fs (last renewal sent %s): exiting with %d so "
                "that no write of this process can meet the next leader's",
                self.lock.namespace, self.lock.name, self.renew_deadline, since, EXIT_LEADERSHIP_LOST,
            )  # fmt: skip
            self.exit_with(EXIT_LEADERSHIP_LOST)

    def start(self, interval: float = FENCE_CHECK_SECONDS) -> Fence:
        def run() -> None:
            while not self.lock.stopped.is_set():
                self.check()
                time.sleep(interval)

        self._thread = threading.Thread(target=run, name="rtj-leader-fence", daemon=True)
        self._thread.start()
        return self


class StandbyHealth:
    """/healthz of a standby on kopf's liveness address (kopf serves it once leading): 200 and the
    role, so the liveness and readiness probes pass and the body says who leads."""

    def __init__(self, liveness_url: str, status: Callable[[], dict[str, Any]]) -> None:
        parts = urlsplit(liveness_url)
        path = parts.path or "/"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != path:
                    self.send_error(404)
                    return
                body = json.dumps(status()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:  # no access log per probe
                pass

        self.server = ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), Handler)
        serve = threading.Thread(target=self.server.serve_forever, name="rtj-standby-health", daemon=True)
        serve.start()

    def stop(self) -> None:
        """Free the port before kopf binds it."""
        self.server.shutdown()
        self.server.server_close()


class Election:
    """One process's candidacy: `wait_until_leading()` blocks while another holds the Lease."""

    def __init__(self, cfg: ElectionConfig, api: client.CoordinationV1Api) -> None:
        self.cfg = cfg
        self.lock = FencedLeaseLock(cfg, api)
        self.fence = Fence(self.lock, cfg.renew_deadline_seconds)
        self.leading = threading.Event()
        self.elector = leaderelection.LeaderElection(
            electionconfig.Config(
                self.lock,
                lease_duration=cfg.lease_seconds,
                renew_deadline=cfg.renew_deadline_seconds,
                retry_period=cfg.retry_seconds,
                onstarted_leading=self._started,
                onstopped_leading=self._stopped,
            )
        )
        # The library logs every attempt at INFO (1/s): transitions are logged here instead.
        logging.getLogger("leaderelection").setLevel(logging.WARNING)

    @classmethod
    def from_environment(cls, cfg: ElectionConfig) -> Election:
        """In-cluster config when running in a pod, else $KUBECONFIG (as rtj.kube)."""
        conf = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            config.load_kube_config(client_configuration=conf)
        return cls(cfg, client.CoordinationV1Api(client.ApiClient(conf)))

    def holder(self) -> str | None:
        record = self.elector.observed_record
        return None if record is None else record.holder_identity

    def status(self) -> dict[str, Any]:
        role = "leader" if self.leading.is_set() else "standby"
        return {"role": role, "identity": self.cfg.identity, "leader": self.holder(),
                "lease": f"{self.cfg.namespace}/{self.cfg.lease}"}  # fmt: skip

    def _started(self) -> None:
        self.fence.start()
        self.leading.set()

    def _stopped(self) -> None:
        if self.lock.stopped.is_set():
            return  # released on a clean stop
        logger.error("lost the leader Lease %s/%s: exiting", self.cfg.namespace, self.cfg.lease)
        exit_process(EXIT_LEADERSHIP_LOST)

    def _run(self) -> None:
        try:
            self.elector.run()
        except Exception:
            logger.exception("leader election failed")
        # run() returns only after leading ended (onstopped_leading exits first) or on an error.
        if not self.lock.stopped.is_set():
            exit_process(EXIT_LEADERSHIP_LOST)

    def wait_until_leading(self, liveness_url: str | None, metrics_port: int = 0) -> float:
        """Block until this process holds the Lease; returns the seconds it waited. Meanwhile /healthz
        answers on `liveness_url` and /metrics (rtj_operator_leader 0) on `metrics_port`."""
        started = time.monotonic()
        metrics.LEADER.set(0)
        metrics.serve(metrics_port)
        health = StandbyHealth(liveness_url, self.status) if liveness_url else None
        logger.info(
            "standby %s: waiting for the leader Lease %s/%s (lease %ss, renew deadline %ss, retry %ss)",
            self.cfg.identity, self.cfg.namespace, self.cfg.lease, self.cfg.lease_seconds,
            self.cfg.renew_deadline_seconds, self.cfg.retry_seconds,
        )  # fmt: skip
        threading.Thread(target=self._run, name="rtj-leader-election", daemon=True).start()
        try:
            self.leading.wait()
        finally:
            if health is not None:
                health.stop()
        waited = time.monotonic() - started
        metrics.LEADER.set(1)
        logger.info(
            "%s holds the leader Lease %s/%s after %.1fs as standby: starting the operator",
            self.cfg.identity, self.cfg.namespace, self.cfg.lease, waited,
        )  # fmt: skip
        return waited

    def release(self) -> None:
        """After kopf returned: clear the holder so the standby need not wait for the Lease to expire."""
        if self.lock.release():
            logger.info("released the leader Lease %s/%s", self.cfg.namespace, self.cfg.lease)


#: This process's election (set by rtj.__main__ before kopf starts; None without one).
_CURRENT: Election | None = None


def current() -> Election | None:
    return _CURRENT


def set_current(election: Election | None) -> None:
    global _CURRENT
    _CURRENT = election


def liveness_url(args: list[str]) -> str | None:
    """kopf's `--liveness=URL` (or `--liveness URL`) among the command-line arguments."""
    for i, arg in enumerate(args):
        if arg.startswith("--liveness="):
            return arg.split("=", 1)[1]
        if arg == "--liveness" and i + 1 < len(args):
            return args[i + 1]
    return None
