"""Time limits for the tests' coroutines, without ``asyncio.wait_for``.

On Python 3.11 ``wait_for`` swallows a cancellation that arrives in the same loop step as the
awaited result, so a task told to stop can run on; ``asyncio.timeout`` cancels correctly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """``await awaitable``, raising ``TimeoutError`` after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        return await awaitable


def run_within(coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``asyncio.run`` with a time limit on the whole coroutine."""
    return asyncio.run(within(coroutine, timeout_s))
