"""Connection deadlines for the embedded API server's HTTP/1.1 listener.

uvicorn closes a keep-alive connection that is idle after a response (`timeout_keep_alive`), but a
connection that never sends a complete request head — opened and left silent, or fed a header a
byte at a time — stays open for ever, and enough of them exhaust the process's file descriptors.
`with_head_timeout` gives uvicorn's h11 protocol a deadline for each request head, the way Go's
`http.Server.ReadHeaderTimeout` does for kube-apiserver. The body has its own deadline in app.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def with_head_timeout(seconds: float) -> type[asyncio.Protocol]:
    """An h11 protocol class that closes a connection whose request head is not in after `seconds`."""

    class HeadDeadlineProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_head_timer()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()  # the next request on this connection gets its own deadline

        def _arm_head_timer(self) -> None:
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            # IDLE: no complete request head since the timer was armed (a request in progress,
            # such as a long watch, has moved h11 past IDLE and is left alone)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeadDeadlineProtocol
