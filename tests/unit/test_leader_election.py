"""rtj.leader_election: the official client's election algorithm (kubernetes.leaderelection, LeaseLock)
run against a fake Lease API that behaves as the API server does (404, AlreadyExists, a Conflict on a
stale resourceVersion), on one fake clock, so that the timing is exact and nothing sleeps.

- Two candidates: the first to create the Lease leads; the other takes it only `lease` seconds after it
  last saw a change, and by then the old leader's fence has fired (no split brain), at least
  `lease - renew_deadline` seconds earlier.
- A released Lease (clean stop) is taken on the standby's next attempt.
- Canary of what we rely on in the pinned library: LeaseLock makes exactly the three calls our timed
  proxy wraps, through `api_instance`; a failure without an API answer is an ApiException to it.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from rtj import kube, leader_election
from rtj.leader_election import EXIT_LEADERSHIP_LOST, ElectionConfig, Fence, FencedLeaseLock, StandbyHealth
from rtj.settings import Settings
from rtj_local.procs import free_port

pytestmark = pytest.mark.unit


class Clock:
    """One clock for the library's wall time and our monotonic time."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        raise AssertionError("a test step must not sleep")


class FakeLeases:
    """The Lease API as the server answers it (one namespace), recording each call."""

    def __init__(self) -> None:
        self.leases: dict[str, client.V1Lease] = {}
        self.version = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.down = False

    def _answer(self, name: str, kwargs: dict[str, Any]) -> None:
        self.calls.append((name, kwargs))
        if self.down:
            raise ApiException(status=0, reason="no API server")

    @staticmethod
    def _error(status: int) -> ApiException:
        exc = ApiException(status=status, reason="fake")
        exc.body = json.dumps({"code": status})
        return exc

    def read_namespaced_lease(self, name: str, namespace: str, **kwargs: Any) -> client.V1Lease:
        self._answer("read", kwargs)
        if name not in self.leases:
            raise self._error(404)
        return copy.deepcopy(self.leases[name])

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease, **kwargs: Any) -> client.V1Lease:
        self._answer("create", kwargs)
        name = body.metadata["name"] if isinstance(body.metadata, dict) else body.metadata.name
        if name in self.leases:
            raise self._error(409)
        self.version += 1
        stored = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, resource_version=str(self.version)), spec=body.spec
        )
        self.leases[name] = copy.deepcopy(stored)
        return stored

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: client.V1Lease, **kwargs: Any
    ) -> client.V1Lease:
        self._answer("replace", kwargs)
        current = self.leases.get(name)
        if current is None:
            raise self._error(404)
        if body.metadata.resource_version != current.metadata.resource_version:
            raise self._error(409)
        self.version += 1
        stored = copy.deepcopy(body)
        stored.metadata.resource_version = str(self.version)
        self.leases[name] = stored
        return copy.deepcopy(stored)


def config(identity: str, lease: int = 5, deadline: float = 3.0, retry: float = 1.0) -> ElectionConfig:
    return ElectionConfig("rtj-operator", "rtj-system", identity, lease, deadline, retry, 1.0)


class Candidate:
    """One operator process's election, stepped by hand (one attempt per `attempt()`)."""

    def __init__(self, identity: str, api: FakeLeases, clock: Clock) -> None:
        self.cfg = config(identity)
        self.lock = FencedLeaseLock(self.cfg, api, clock=clock)  # type: ignore[arg-type]
        self.exits: list[int] = []
        self.fence = Fence(self.lock, self.cfg.renew_deadline_seconds, self.exits.append, clock)
        self.elector = leaderelection.LeaderElection(
            electionconfig.Config(self.lock, self.cfg.lease_seconds, self.cfg.renew_deadline_seconds,
                                  self.cfg.retry_seconds, lambda: None, None)
        )  # fmt: skip

    def attempt(self) -> bool:
        return bool(self.elector.try_acquire_or_renew())


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(leaderelection, "time", fake)  # the library reads time.time() there
    return fake


def holder(api: FakeLeases) -> str | None:
    return api.leases["rtj-operator"].spec.holder_identity


def test_the_standby_takes_over_only_after_the_old_leader_fenced_itself(clock: Clock) -> None:
    api = FakeLeases()
    a, b = Candidate("a", api, clock), Candidate("b", api, clock)
    assert a.attempt() and holder(api) == "a"  # creates the Lease
    assert not b.attempt()  # held, and b has just seen it
    for _ in range(10):  # a renews every second; b never takes it
        clock.now += 1
        assert a.attempt() and not b.attempt()
        a.fence.check()
    assert a.exits == [] and holder(api) == "a"
    # a dies (SIGKILL, or its node): no more renewals. b attempts every second.
    last_renewal, fenced_at, taken_at, tick = clock.now, None, None, 0
    while taken_at is None and tick < 200:
        tick += 1
        clock.now = last_renewal + tick / 10
        if not a.exits:
            a.fence.check()  # what a's fence thread does (were a alive, only cut off from the API)
            fenced_at = clock.now if a.exits else None
        if tick % 10 == 0 and b.attempt():
            taken_at = clock.now
    assert taken_at is not None, "the standby never took over"
    assert a.exits == [EXIT_LEADERSHIP_LOST] and holder(api) == "b"
    assert fenced_at is not None
    assert fenced_at - last_renewal == pytest.approx(a.cfg.renew_deadline_seconds + 0.1)
    assert taken_at - fenced_at >= a.cfg.lease_seconds - a.cfg.renew_deadline_seconds - 0.2
    assert taken_at - last_renewal <= a.cfg.lease_seconds + b.cfg.retry_seconds + 1e-6
    # The old leader, were it still running, cannot renew a Lease someone else holds.
    assert not a.attempt() and holder(api) == "b"


def test_a_renewal_counts_from_when_it_was_sent_and_a_failed_one_not_at_all(clock: Clock) -> None:
    api = FakeLeases()
    a = Candidate("a", api, clock)
    assert a.attempt()
    assert a.lock.renewed_at == clock.now
    clock.now += 2
    api.down = True  # no API server: the attempt fails, the fence still counts from the last success
    assert not a.attempt()
    assert a.lock.renewed_at == clock.now - 2
    a.fence.check()
    assert a.exits == []
    clock.now += 1.01
    a.fence.check()
    assert a.exits == [EXIT_LEADERSHIP_LOST]


def test_a_released_lease_is_taken_at_the_next_attempt_and_a_released_leader_is_not_fenced(
    clock: Clock,
) -> None:
    api = FakeLeases()
    a, b = Candidate("a", api, clock), Candidate("b", api, clock)
    assert a.attempt() and not b.attempt()
    clock.now += 0.5
    assert a.lock.release() and holder(api) is None
    assert not a.attempt()  # a released leader no longer writes
    clock.now += 0.5
    assert b.attempt() and holder(api) == "b"
    clock.now += 60
    a.fence.check()
    assert a.exits == []  # stopped on purpose: kopf has already returned
    assert not a.lock.release()  # b's now: not cleared


def test_every_call_of_the_library_lock_goes_through_the_timed_proxy_with_a_timeout(clock: Clock) -> None:
    """Canary of the pinned kubernetes.leaderelection: LeaseLock calls `api_instance` for read, create
    and replace only; our proxy adds the timeout to each."""
    api = FakeLeases()
    a = Candidate("a", api, clock)
    assert a.attempt()  # read (404), create
    clock.now += 1
    assert a.attempt()  # read, replace
    assert [name for name, _ in api.calls] == ["read", "create", "read", "replace"]
    assert all(kwargs == {"_request_timeout": 1.0} for _, kwargs in api.calls)


def test_no_answer_from_the_api_server_is_an_api_exception_to_the_library() -> None:
    class Unreachable:
        def read_namespaced_lease(self, *_: Any, **__: Any) -> None:
            raise OSError("connection refused")

    proxy = leader_election._TimedLeases(Unreachable(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(ApiException) as raised:
        proxy.read_namespaced_lease("rtj-operator", "rtj-system")
    assert raised.value.status == 0 and "connection refused" in str(raised.value.reason)


def test_kube_calls_the_write_fence_before_each_write_and_never_before_a_read() -> None:
    sent: list[str] = []

    class Response:
        status, reason = 200, "OK"

        def read(self) -> bytes:
            return b"{}"

    class ApiClient:
        def param_serialize(self, method: str, **_: Any) -> tuple[Any, ...]:
            return method, "url", {}, None, None

        def call_api(self, method: str, *_: Any, **__: Any) -> Response:
            sent.append(method)
            return Response()

    k = kube.Kube(ApiClient(), workers=1)  # type: ignore[arg-type]
    fenced: list[str] = []

    def fence() -> None:
        fenced.append("checked")
        if len(fenced) == 2:
            raise SystemExit(EXIT_LEADERSHIP_LOST)  # what exit_process would do

    k.write_fence = fence
    k._request_sync("GET", "/api/v1/pods")
    k._request_sync("POST", "/api/v1/namespaces/ns/pods", {})
    with pytest.raises(SystemExit):
        k._request_sync("DELETE", "/api/v1/namespaces/ns/pods/p")
    assert sent == ["GET", "POST"] and fenced == ["checked", "checked"]


def test_standby_health_answers_its_path_with_the_role_and_frees_the_port() -> None:
    port = free_port()
    health = StandbyHealth(f"http://127.0.0.1:{port}/healthz", lambda: {"role": "standby", "leader": "a"})
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            assert resp.status == 200 and json.loads(resp.read()) == {"role": "standby", "leader": "a"}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert missing.value.code == 404
    finally:
        health.stop()
    again = StandbyHealth(f"http://127.0.0.1:{port}/healthz", dict)  # kopf binds it next
    again.stop()


@pytest.mark.parametrize(
    ("args", "url"),
    [
        (["--standalone", "--liveness=http://0.0.0.0:8080/healthz"], "http://0.0.0.0:8080/healthz"),
        (["--liveness", "http://127.0.0.1:1/h", "-m", "x"], "http://127.0.0.1:1/h"),
        (["--standalone"], None),
    ],
)
def test_the_liveness_address_is_kopfs_own_option(args: list[str], url: str | None) -> None:
    assert leader_election.liveness_url(args) == url


def test_identities_are_unique_per_process() -> None:
    one, two = ElectionConfig.unique_identity("rtj-abc"), ElectionConfig.unique_identity("rtj-abc")
    assert one != two and one.startswith("rtj-abc_")


@pytest.mark.parametrize(
    "env",
    [
        {"RTJ_LEADER_ELECTION_LEASE": "rtj"},  # no namespace
        {"RTJ_LEADER_ELECTION_RENEW_DEADLINE_SECONDS": "5"},  # not below the lease (5)
        {"RTJ_LEADER_ELECTION_RETRY_SECONDS": "3"},  # 1.2 x retry above the renew deadline (3)
    ],
)
def test_an_election_that_could_split_the_brain_stops_the_operator(env: dict[str, str]) -> None:
    with pytest.raises(SystemExit, match="RTJ_LEADER_ELECTION"):
        Settings.from_env(env)


def test_the_default_timing_keeps_the_library_s_own_rules() -> None:
    s = Settings()
    assert s.leader_election_lease == ""  # off unless set: `python -m rtj` alone is active at once
    electionconfig.Config(
        object(), s.leader_election_lease_seconds, s.leader_election_renew_deadline_seconds,
        s.leader_election_retry_seconds, lambda: None, None,
    )  # fmt: skip  # exits on a rule it refuses
    assert datetime.now(UTC)  # the settings are pure: no clock read at import
