"""Ends the operator when one of kopf's watch streams dies, so that its Deployment restarts it.

kopf (1.45.2) runs one task per watched resource and namespace, named "watcher for <resource>@<ns>",
and never starts it again once it has failed (nolar/kopf#1276, #787, #996): a watch ERROR event
other than 410, or a list refused after its retries (403, 5xx while the API server's storage
initializes), logs "Watcher for ... has failed" and the operator carries on blind. A dead Lease
watcher would have the ladder replace healthy pods as silent. kopf has no option to respawn a
watcher or to exit, hence this hand-written guard: any watch stream that ends other than by kopf's
own cancel (a resource going away, the operator stopping) ends the process with EXIT_WATCH_LOST.
Restarting is safe: the operator's state is the jobs' status (see rtj.ladder.decide).

A watcher can die within milliseconds of its start (an ERROR event right after its first list),
between two looks at the running tasks; so the guard also puts a done-callback on every task the
loop creates (a task factory: a task's name is set only after the factory returns, hence a callback
at its end, not a filter at its start).

The pure part: `is_watch`, `remember`, `dead_watches`, `live_watches`, `exit_message`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: Names kopf gives its watch-stream tasks (kopf/_core/reactor/orchestration.py): the resources'
#: watchers and, with peering, the peering observers (the same watcher underneath).
WATCH_PREFIXES = ("watcher for ", "peering observer for ")
#: How often the guard looks at the running tasks (a death is also noticed at once: see the top).
CHECK_SECONDS = 2.0
#: The operator's exit code when a watch stream died (sysexits' EX_TEMPFAIL: a restart fixes it).
#: Not a pod exit code of rtj.contract.ExitCode: the operator's own, read by nobody but its logs.
EXIT_WATCH_LOST = 75
ISSUE = "nolar/kopf#1276"
GUARD_TASK_NAME = "rtj watch guard"
logger = logging.getLogger("rtj.watch_guard")


@dataclass(frozen=True)
class DeadWatch:
    name: str
    why: str


def is_watch(task: asyncio.Task[Any]) -> bool:
    return task.get_name().startswith(WATCH_PREFIXES)


def remember(
    tasks: Iterable[asyncio.Task[Any]], seen: frozenset[asyncio.Task[Any]]
) -> frozenset[asyncio.Task[Any]]:
    """`seen` plus the watch tasks among `tasks`, less the cancelled ones (kopf's normal stop)."""
    return frozenset(t for t in seen.union(filter(is_watch, tasks)) if not t.cancelled())


def dead_watches(seen: Iterable[asyncio.Task[Any]]) -> list[DeadWatch]:
    """The watch tasks that ended other than by a cancel, by name."""
    dead = [t for t in seen if is_watch(t) and t.done() and not t.cancelled()]
    return [DeadWatch(t.get_name(), _why(t)) for t in sorted(dead, key=lambda t: t.get_name())]


def live_watches(tasks: Iterable[asyncio.Task[Any]]) -> list[str]:
    """The names of the running watch tasks, sorted (the `watches` probe of /healthz)."""
    return sorted(t.get_name() for t in tasks if is_watch(t) and not t.done())


def exit_message(dead: DeadWatch) -> str:
    return (
        f"kopf's {dead.name} has ended ({dead.why}) and kopf never starts it again ({ISSUE}): "
        f"exiting with {EXIT_WATCH_LOST} so that the operator is restarted"
    )


def _why(task: asyncio.Task[Any]) -> str:
    exc = task.exception()
    if exc is None:
        return "finished unexpectedly"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def exit_process(code: int) -> None:
    """Ends the process at once (os._exit: no teardown that could wait on a stuck task), logs flushed."""
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class WatchGuard:
    """`start()` from kopf's startup (inside the running loop), `await stop()` from its cleanup."""

    def __init__(
        self, exit_with: Callable[[int], Any] = exit_process, interval: float = CHECK_SECONDS
    ) -> None:
        self._exit, self._interval = exit_with, interval
        self._seen: frozenset[asyncio.Task[Any]] = frozenset()
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._previous_factory: Any = None
        self._wake = asyncio.Event()
        self._stopped = self._exited = False

    def start(self) -> WatchGuard:
        self._loop = asyncio.get_running_loop()
        self._previous_factory = self._loop.get_task_factory()
        self._loop.set_task_factory(self._task_factory)
        self._task = asyncio.create_task(self._run(), name=GUARD_TASK_NAME)
        return self

    async def stop(self) -> None:
        self._stopped = True
        if self._loop is not None and self._loop.get_task_factory() == self._task_factory:
            self._loop.set_task_factory(self._previous_factory)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        make = self._previous_factory
        task = make(loop, coro, **kwargs) if make is not None else asyncio.Task(coro, loop=loop, **kwargs)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        if isinstance(task, asyncio.Task) and is_watch(task) and not task.cancelled():
            self._seen = self._seen | {task}
            self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            if self._check():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._interval)

    def _check(self) -> bool:
        """True once the guard has done its job (the exit called) or was stopped."""
        if self._stopped or self._exited:
            return True
        try:
            self._seen = remember(asyncio.all_tasks(), self._seen)
            dead = dead_watches(self._seen)
        except Exception:  # the guard must not die silently in turn
            logger.exception("the watch guard could not look at the tasks; trying again")
            return False
        if not dead:
            return False
        for one in dead:
            logger.critical(exit_message(one))
        self._exited = True
        self._exit(EXIT_WATCH_LOST)
        return True
