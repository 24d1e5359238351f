"""rtj.watch_guard against the pinned kopf's own machinery: kopf's orchestration spawns its real
watcher (`spawn_missing_watchers`, `queueing.watcher`, its aiohttp client) for Leases, talking to a
small HTTP server in this process that plays the API server. The ways a watcher dies for good
(nolar/kopf#1276) end the process through the guard; kopf's own stop of a healthy watcher does not.
This pins what the guard relies on: the task's name and how it ends. (tests/integration/
test_operator_watch_guard.py checks the names on the real operator against the real API server.)"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp.web
import kopf
import pytest
from async_wait import until
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.clients import auth
from kopf._cogs.structs import credentials, references
from kopf._core.reactor import orchestration
from rtj.watch_guard import EXIT_WATCH_LOST, WatchGuard

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

LEASES = references.Resource(
    "coordination.k8s.io", "v1", "leases", kind="Lease", namespaced=True, verbs=["list", "watch"]
)
LEASE_WATCHER = "watcher for leases.v1.coordination.k8s.io@ns"
EMPTY_LIST = {"apiVersion": "v1", "kind": "LeaseList", "metadata": {"resourceVersion": "7"}, "items": []}


def status(code: int, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


@asynccontextmanager
async def api_server(behaviour: str) -> AsyncIterator[str]:
    """`forbidden`: every list is refused (403). `watch-error`: the list succeeds, the watch sends an
    ERROR event with code 500 (kopf restarts its stream on 410 only). `quiet`: the watch stays open."""

    async def leases(request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        if behaviour == "forbidden":
            return aiohttp.web.json_response(status(403, 'leases is forbidden: User "x"'), status=403)
        if request.query.get("watch") != "true":
            return aiohttp.web.json_response(EMPTY_LIST)
        response = aiohttp.web.StreamResponse()
        await response.prepare(request)
        if behaviour == "watch-error":
            event = {"type": "ERROR", "object": status(500, "storage is (re)initializing")}
            await response.write(json.dumps(event).encode() + b"\n")
            return response
        await asyncio.Event().wait()  # quiet: until the client goes away
        return response

    app = aiohttp.web.Application()
    app.router.add_get("/apis/coordination.k8s.io/v1/namespaces/ns/leases", leases)
    runner = aiohttp.web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def lease_watcher(server: str) -> AsyncIterator[asyncio.Task[Any]]:
    """What kopf's orchestrator does for one indexed resource in one namespace, and at its end."""
    vault = credentials.Vault()
    await vault.populate({"test": credentials.ConnectionInfo(server=server, insecure=True)})
    auth.vault_var.set(vault)  # the watcher task copies this context
    settings = kopf.OperatorSettings()
    settings.networking.error_backoffs = [0.01]
    operator_paused = aiotoggles.ToggleSet(any)
    ensemble = orchestration.Ensemble(
        operator_indexed=aiotoggles.ToggleSet(all),
        operator_paused=operator_paused,
        peering_missing=await operator_paused.make_toggle(False),
    )

    async def processor(**_: Any) -> None:
        return None

    await orchestration.spawn_missing_watchers(
        processor=processor,
        settings=settings,
        indexed_resources={LEASES},
        watched_resources=[LEASES],
        watched_namespaces=["ns"],
        ensemble=ensemble,
    )
    (task,) = ensemble.watcher_tasks.values()
    try:
        yield task
    finally:
        await orchestration.terminate_redundancies(
            remaining_resources=set(), remaining_namespaces=set(), ensemble=ensemble
        )
        await vault.close()


@pytest.mark.parametrize(
    ("behaviour", "why"),
    [
        ("forbidden", "APIForbiddenError: ('leases is forbidden"),
        ("watch-error", "WatchingError: Error in the watch-stream: {'kind': 'Status'"),
    ],
)
def test_a_lease_watcher_kopf_gives_up_on_ends_the_process(
    behaviour: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    exits: list[int] = []

    async def scenario() -> None:
        guard = WatchGuard(exit_with=exits.append, interval=3600).start()  # only the callback
        async with api_server(behaviour) as server, lease_watcher(server) as task:
            assert task.get_name() == LEASE_WATCHER
            await until(lambda: bool(exits))
            assert task.done() and not task.cancelled(), "kopf leaves the watcher dead"
        await guard.stop()

    with caplog.at_level(logging.CRITICAL, logger="rtj.watch_guard"):
        asyncio.run(scenario())
    assert exits == [EXIT_WATCH_LOST]
    (record,) = [r for r in caplog.records if r.name == "rtj.watch_guard"]
    assert record.levelno == logging.CRITICAL
    assert f"kopf's {LEASE_WATCHER} has ended ({why}" in record.getMessage()
    assert "nolar/kopf#1276" in record.getMessage()


def test_kopf_stopping_a_healthy_watcher_is_not_a_death() -> None:
    """What kopf does when a resource or namespace goes away, and at the operator's stop."""
    exits: list[int] = []

    async def scenario() -> None:
        guard = WatchGuard(exit_with=exits.append, interval=0.01).start()
        async with api_server("quiet") as server:
            async with lease_watcher(server) as task:
                await until(lambda: task in guard._seen)  # the guard remembered it while it ran
                assert not task.done()
            # kopf stopped it as terminate_redundancies() does.
            assert task.cancelled()
            await until(lambda: task not in guard._seen)  # a later look forgets the cancelled one
        await guard.stop()

    asyncio.run(scenario())
    assert exits == []
