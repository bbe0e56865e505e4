"""The tests' time limit passes a cancellation on, even one that arrives with the result."""

from __future__ import annotations

import asyncio

import pytest

from tests.aio import run_within, within


def test_a_cancellation_arriving_with_the_result_still_cancels() -> None:
    async def scenario() -> None:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiter = asyncio.create_task(within(future, 5))
        await asyncio.sleep(0)  # the waiter now awaits the future
        future.set_result(1)  # the result and the cancellation land in the same loop step
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    run_within(scenario(), 5)


def test_the_limit_raises_timeout_error() -> None:
    with pytest.raises(TimeoutError):
        run_within(asyncio.sleep(1), 0.01)
