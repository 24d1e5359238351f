"""A deadline-based wait for async unit tests (the sync one is rtj_local.wait.wait_for)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    """Return once `predicate()` holds; TimeoutError after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)
