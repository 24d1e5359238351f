"""Deadline-based waiting: the only way tests and scripts wait for something (no bare sleeps)."""

from __future__ import annotations

import time
from collections.abc import Callable


class WaitTimeout(AssertionError):
    """The predicate did not hold before the deadline. An AssertionError so pytest reports it plainly."""


def wait_for[T](
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.2,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Calls `predicate` until it returns a truthy value, which is returned; raises WaitTimeout after
    `timeout` seconds. Exceptions from the predicate propagate (catch inside it what is expected).

    `message` (or a callable producing it, evaluated only on timeout, e.g. to dump current state)
    says what was awaited.
    """
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = predicate()
        if last:
            return last
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {text} (last value: {last!r})")
        time.sleep(min(interval, remaining))
