"""uvicorn's HTTP/1.1 protocol with a header read timeout, which uvicorn lacks.

uvicorn closes a connection idle between requests after ``timeout_keep_alive``, but a connection
that never sends a byte, or sends one header line every few seconds, it keeps open for ever: enough
of them exhaust the process's open files. Here a connection must send a whole request head within
``header_timeout`` seconds of opening or of its last response, or it is closed.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderTimeoutProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is not complete in time."""

    header_timeout: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # a whole head came (or the connection is done)
            self._disarm()

    def on_response_complete(self) -> None:
        self._arm()  # (first: a pipelined request that the call below starts disarms it again)
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def protocol_with_header_timeout(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class to give ``uvicorn.Config(http=...)``."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
