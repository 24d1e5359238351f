"""rtj.watch_guard with real asyncio tasks named as kopf names its watch streams (nolar/kopf#1276): a
watcher that fails or returns is reported and ends the process (the exit injected here) exactly once;
one cancelled (kopf's own stop) is not; tasks not named as watch streams are ignored. Run on the
standard loop and on uvloop (which `kopf run` uses when it is installed)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop  # installed with the project's extras; `kopf run` uses it when present
from async_wait import until
from rtj import handlers, watch_guard
from rtj.watch_guard import EXIT_WATCH_LOST, DeadWatch, WatchGuard, dead_watches, live_watches, remember

pytestmark = pytest.mark.unit


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    if request.param == "asyncio":
        return asyncio.run
    return lambda coro: asyncio.run(coro, loop_factory=uvloop.new_event_loop)


WATCH_ERROR = "Error in the watch-stream: {'code': 500}"


async def fails(message: str = WATCH_ERROR) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(message)


async def returns() -> None:
    await asyncio.sleep(0)


async def forever() -> None:
    await asyncio.Event().wait()


async def settle(*tasks: asyncio.Task[Any]) -> None:
    await asyncio.wait(tasks, timeout=5)


def test_a_failed_or_finished_watcher_is_dead_a_cancelled_one_and_other_tasks_are_not(run: Any) -> None:
    async def scenario() -> tuple[list[DeadWatch], list[str]]:
        failed = asyncio.create_task(fails(), name="watcher for leases.v1.coordination.k8s.io@ns")
        finished = asyncio.create_task(returns(), name="watcher for pods.v1@ns")
        cancelled = asyncio.create_task(forever(), name="watcher for nodes.v1@None")
        other = asyncio.create_task(fails(), name="poster of events")
        observer = asyncio.create_task(fails("403"), name="peering observer for rtj@ns")
        running = asyncio.create_task(forever(), name="watcher for services.v1@ns")
        seen = remember([failed, finished, cancelled, other, observer, running], frozenset())
        assert seen == {failed, finished, cancelled, observer, running}
        cancelled.cancel()
        await settle(failed, finished, cancelled, other, observer)
        seen = remember([], seen)
        assert cancelled not in seen, "a cancelled watcher is forgotten"
        names = live_watches(asyncio.all_tasks())
        running.cancel()
        return dead_watches(seen), names

    dead, live = run(scenario())
    assert dead == [
        DeadWatch("peering observer for rtj@ns", "RuntimeError: 403"),
        DeadWatch("watcher for leases.v1.coordination.k8s.io@ns", f"RuntimeError: {WATCH_ERROR}"),
        DeadWatch("watcher for pods.v1@ns", "finished unexpectedly"),
    ]
    assert live == ["watcher for services.v1@ns"]


def test_the_reason_is_one_line_and_names_the_issue(run: Any) -> None:
    async def scenario() -> list[DeadWatch]:
        task = asyncio.create_task(fails("storage is\n(re)initializing" + "x" * 500), name="watcher for a@b")
        await settle(task)
        return dead_watches({task})

    (dead,) = run(scenario())
    message = watch_guard.exit_message(dead)
    assert "\n" not in message
    assert "RuntimeError: storage is (re)initializing" in message
    assert "nolar/kopf#1276" in message and str(EXIT_WATCH_LOST) in message
    assert len(dead.why) < 400


def test_the_guard_exits_once_even_for_a_watcher_that_died_between_two_looks(run: Any) -> None:
    """The interval is an hour: only the done-callback can have noticed these deaths."""
    exits: list[int] = []

    async def scenario() -> None:
        guard = WatchGuard(exit_with=exits.append, interval=3600).start()
        await asyncio.sleep(0)  # the guard's first look: no watcher yet
        first = asyncio.create_task(fails(), name="watcher for pods.v1@ns")
        second = asyncio.create_task(fails(), name="watcher for leases.v1.coordination.k8s.io@ns")
        await settle(first, second)
        for _ in range(5):
            await asyncio.sleep(0)
        assert guard._task is not None and guard._task.done(), "the guard stops after the exit"
        await guard.stop()

    run(scenario())
    assert exits == [EXIT_WATCH_LOST]


def test_the_guard_ignores_cancelled_watchers_other_tasks_and_anything_after_its_stop(run: Any) -> None:
    exits: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        guard = WatchGuard(exit_with=exits.append, interval=0.01).start()
        watcher = asyncio.create_task(forever(), name="watcher for nodes.v1@None")
        other = asyncio.create_task(fails(), name="poster of events")
        await until(lambda: watcher in guard._seen)  # remembered while it runs
        watcher.cancel()
        await settle(watcher, other)
        await until(lambda: watcher not in guard._seen)  # a later look forgets the cancelled one
        await guard.stop()
        assert loop.get_task_factory() is None, "the loop's task factory is given back"
        late = asyncio.create_task(fails(), name="watcher for pods.v1@ns")  # kopf's teardown
        await settle(late)
        await asyncio.sleep(0.05)

    run(scenario())
    assert exits == []


def test_the_probe_lists_the_running_watch_streams(run: Any) -> None:
    async def scenario() -> list[str]:
        tasks = [
            asyncio.create_task(forever(), name=name)
            for name in ("watcher for pods.v1@ns", "watcher for nodes.v1@None", "daemon killer")
        ]
        await asyncio.sleep(0)
        try:
            return await handlers.watches()
        finally:
            for task in tasks:
                task.cancel()
            await settle(*tasks)

    assert run(scenario()) == ["watcher for nodes.v1@None", "watcher for pods.v1@ns"]
