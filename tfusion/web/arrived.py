"""A request body that has already arrived, taken without a deadline.

Why: a body of a few KiB arrives with its request head, and uvicorn has it by the time the app
runs. Reading it under a body deadline (an anyio cancel scope and a timer) cost a tenth of what a
webhook review answered from its memo costs, and about 5 % of the embedded API server's CPU for
each write. `first_message` runs the server's `receive` up to its first suspension: when it
finishes there, its message was waiting and is handed over as it is; when it suspends, the caller
reads the body as always, under its deadline, through the returned `receive`, which resumes that
same call (nothing is received twice, and the event loop's answers, a cancellation included, reach
it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

#: an ASGI receive: each call gives the next message
Receive = Callable[[], Awaitable[Any]]


def first_message(receive: Receive) -> tuple[Any | None, Receive]:
    """(the first message when it is already there, else None; the receive to read on with, whose
    first call gives that message, or the rest of the call that is under way)."""
    pending = receive()
    if not isinstance(pending, Coroutine):  # an ASGI server whose receive is another awaitable
        return None, _then(pending, receive)
    try:
        waiting_on = pending.send(None)
    except StopIteration as arrived:
        return arrived.value, _then(_Given(arrived.value), receive)
    return None, _then(_Resume(pending, waiting_on), receive)


def _then(first: Awaitable[Any], receive: Receive) -> Receive:
    """`receive`, whose first call gives what `first` gives."""
    taken = False

    async def again() -> Any:
        nonlocal taken
        if not taken:
            taken = True
            return await first
        return await receive()

    return again


class _Given:
    """An awaitable of a message already received (not a coroutine: left unawaited, it warns of nothing)."""

    def __init__(self, message: Any) -> None:
        self.message = message

    def __await__(self) -> Generator[Any, Any, Any]:
        return self.message
        yield  # a generator that finishes at once


class _Resume:
    """Awaiting a coroutine that has already run up to its first suspension (on `waiting_on`): the
    event loop's answers (values, exceptions such as a cancellation) are passed on to it."""

    def __init__(self, coroutine: Any, waiting_on: Any) -> None:
        self.coroutine, self.waiting_on = coroutine, waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        waiting_on = self.waiting_on
        while True:
            try:
                sent = yield waiting_on
            except BaseException as exc:  # thrown in by the event loop (a cancellation): the coroutine's
                try:
                    waiting_on = self.coroutine.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                waiting_on = self.coroutine.send(sent)
            except StopIteration as done:
                return done.value
