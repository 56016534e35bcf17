"""tfusion/leanhttp.py against a small HTTP/1.1 server on a loopback socket: the answer framings a
server may use (Content-Length, chunked, no body for 204, close), connection reuse, and the
refusal of what it does not read (a compressed body, a non-HTTP answer)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tfusion.leanhttp import LeanTransport

pytestmark = pytest.mark.anyio

ANSWERS = {
    b"/length": b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
    b"/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n",
    b"/empty": b"HTTP/1.1 204 No Content\r\n\r\n",
    b"/close": b"HTTP/1.1 404 Not Found\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
    b"/gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 1\r\n\r\nx",
    b"/junk": b"SSH-2.0-OpenSSH\r\n",
}


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, list[int]]]:
    """(port, connections accepted so far)."""
    accepted: list[int] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                writer.write(ANSWERS[path])
                await writer.drain()
                if path in (b"/close", b"/junk"):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    yield port, accepted
    srv.close()


async def test_framings_and_reuse(server: tuple[int, list[int]]) -> None:
    port, accepted = server
    lean = LeanTransport("127.0.0.1", port, "", None, "127.0.0.1")
    assert await lean.send("GET", "/length", None, "", 5) == (200, b"hello")
    assert await lean.send("POST", "/chunked", b"{}", "application/json", 5) == (200, b"hello")
    assert await lean.send("DELETE", "/empty", None, "", 5) == (204, b"")
    assert len(accepted) == 1, "one kept-alive connection served all three"
    assert await lean.send("GET", "/close", None, "", 5) == (404, b"{}")
    assert await lean.send("GET", "/length", None, "", 5) == (200, b"hello")
    assert len(accepted) == 2, "a connection the server closes is not reused"
    lean.close()


async def test_what_it_does_not_read_is_an_error(server: tuple[int, list[int]]) -> None:
    port, _ = server
    lean = LeanTransport("127.0.0.1", port, "", None, "127.0.0.1")
    with pytest.raises(ConnectionError, match="content encoding"):
        await lean.send("GET", "/gzip", None, "", 5)
    with pytest.raises(ConnectionError, match=r"not an HTTP/1\.1 answer"):
        await lean.send("GET", "/junk", None, "", 5)
    lean.close()
