"""KubeClient's lean transport (tfusion/leanhttp.py) against the embedded API server over
HTTPS: small requests go over kept-alive connections, answers and errors read as through kr8s, a
401 is handed back to kr8s (which re-reads the token), and a kept-alive connection the server
closed is retried for a repeatable request and reported for any other. Watches stream on a
connection of their own; their framing is read from a socket pair whose other end sends it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import pytest

from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, BadRequest, KubeClient, NotFound, ServerError
from tfusion.leanhttp import Head, Streamed

pytestmark = pytest.mark.anyio


def cm(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "data": {"k": "v"}}


def lean_of(kube: KubeClient) -> Any:
    assert kube.lean is not None, "a token kubeconfig gets the lean transport"
    return kube.lean


async def test_requests_answers_and_errors_go_over_the_lean_transport(kube: KubeClient) -> None:
    lean = lean_of(kube)
    before = lean.sent
    created = await kube.create(r.CONFIGMAPS, cm("lean-a"))
    assert created["metadata"]["name"] == "lean-a"
    listed = await kube.list(r.CONFIGMAPS, namespace="default", label_selector="")
    assert "lean-a" in {o["metadata"]["name"] for o in listed}
    with pytest.raises(NotFound, match="lean-missing"):
        await kube.get(r.CONFIGMAPS, "lean-missing", namespace="default")
    with pytest.raises(AlreadyExists):
        await kube.create(r.CONFIGMAPS, cm("lean-a"))
    await kube.patch(r.CONFIGMAPS, "lean-a", {"data": {"k": "w"}}, namespace="default")
    assert (await kube.get(r.CONFIGMAPS, "lean-a", namespace="default"))["data"] == {"k": "w"}
    await kube.delete(r.CONFIGMAPS, "lean-a", namespace="default")
    assert lean.sent - before >= 7 and lean.handed_back == 0


async def test_a_refused_token_is_handed_back_to_kr8s_and_the_new_one_taken(kube: KubeClient) -> None:
    lean = lean_of(kube)
    good = lean.token
    lean.token = "not-the-token"
    await kube.create(r.CONFIGMAPS, cm("lean-b"))  # 401 on the lean path, then kr8s with its token
    assert lean.handed_back == 1 and lean.token == good
    sent = lean.sent
    await kube.get(r.CONFIGMAPS, "lean-b", namespace="default")
    assert lean.sent == sent + 1 and lean.handed_back == 1


class _ClosedAfterTheRequest(asyncio.StreamReader):
    """A kept-alive connection the server closes just as the next request goes out (its
    keep-alive timeout racing the client): not at end-of-stream when the client picks it, the
    request reaches the server, and the client reads end-of-stream instead of the answer. Shutting
    the socket down instead would let the client see the end before it sends, or not, by timing."""

    async def readline(self) -> bytes:
        self.feed_eof()
        return await super().readline()


def _close_idle_from_the_server_side(lean: Any) -> None:
    lean._idle[:] = [(_ClosedAfterTheRequest(), writer, since) for _reader, writer, since in lean._idle]


async def test_a_closed_kept_alive_connection_is_retried_only_when_repeatable(kube: KubeClient) -> None:
    lean = lean_of(kube)
    await kube.create(r.CONFIGMAPS, cm("lean-c"))
    _close_idle_from_the_server_side(lean)
    assert (await kube.get(r.CONFIGMAPS, "lean-c", namespace="default"))["metadata"]["name"] == "lean-c"
    _close_idle_from_the_server_side(lean)
    # the server got this POST but its answer is lost: the caller is told so, and the POST is not
    # sent a second time (which would make a create that happened look like AlreadyExists)
    with pytest.raises(ServerError, match="closed before an answer"):
        await kube.create(r.CONFIGMAPS, cm("lean-d"))
    assert (await kube.get(r.CONFIGMAPS, "lean-d", namespace="default"))["data"] == {"k": "v"}


async def _events(kube: KubeClient, rv: str, want: int) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    async with contextlib.aclosing(kube.watch(r.CONFIGMAPS, namespace="default", resource_version=rv,
                                              timeout_seconds=5)) as events:
        async for kind, obj in events:
            if kind != "BOOKMARK":
                seen.append((kind, obj["metadata"]["name"]))
            if len(seen) == want:
                break
    return seen


async def test_a_watch_streams_on_the_lean_transport_and_a_refused_token_goes_to_kr8s(kube: KubeClient) -> None:
    lean = lean_of(kube)
    rv = (await kube.list(r.CONFIGMAPS, namespace="default")).resource_version
    await kube.create(r.CONFIGMAPS, cm("lean-w"))
    await kube.patch(r.CONFIGMAPS, "lean-w", {"data": {"k": "w"}}, namespace="default")
    sent, handed_back = lean.sent, lean.handed_back
    assert await _events(kube, rv, 2) == [("ADDED", "lean-w"), ("MODIFIED", "lean-w")]
    assert lean.sent == sent + 1 and lean.handed_back == handed_back
    good, lean.token = lean.token, "not-the-token"
    assert await _events(kube, rv, 2) == [("ADDED", "lean-w"), ("MODIFIED", "lean-w")]  # through kr8s
    assert lean.handed_back == handed_back + 1 and lean.token == good


async def test_a_refused_watch_raises_the_servers_error(kube: KubeClient) -> None:
    unknown = r.ApiResource("", "v1", "nosuchthings", "NoSuchThing", True)
    with pytest.raises(NotFound, match="nosuchthings"):
        async with contextlib.aclosing(kube.watch(unknown, namespace="default", timeout_seconds=1)) as events:
            async for _ in events:
                pass
    with pytest.raises(BadRequest):
        async with contextlib.aclosing(kube.watch(r.CONFIGMAPS, namespace="default", label_selector="a in (",
                                                  timeout_seconds=1)) as events:
            async for _ in events:
                pass


async def _lines(wire: bytes, head: Head) -> list[bytes]:
    """The lines read from a socket pair whose other end sends `wire` and closes."""
    ours, theirs = socket.socketpair()
    with theirs:
        theirs.sendall(wire)
    reader, writer = await asyncio.open_connection(sock=ours)
    streamed = Streamed(head, reader, writer, read_timeout=5)
    try:
        return [line async for line in streamed.lines()]
    finally:
        streamed.close()


async def test_chunked_lines_are_joined_across_chunks_and_split_within_one() -> None:
    wire = b"5\r\n{\"a\":\r\n9\r\n1}\n{\"b\":2\r\n3\r\n}\n\n\r\n0\r\n\r\n"
    assert await _lines(wire, Head(200, None, True, True)) == [b'{"a":1}', b'{"b":2}']


async def test_a_stream_cut_inside_a_chunk_or_badly_framed_is_a_connection_error() -> None:
    with pytest.raises(ConnectionError, match="ended inside a chunk"):
        await _lines(b"10\r\n{}\n", Head(200, None, True, True))
    with pytest.raises(ConnectionError, match="not chunked"):
        await _lines(b"zz\r\n{}\n", Head(200, None, True, True))


async def test_a_stream_without_chunks_is_read_to_its_length_or_its_end() -> None:
    by_length = await _lines(b'{"a":1}\n{"b":2}\nignored', Head(200, 16, False, True))
    assert by_length == [b'{"a":1}', b'{"b":2}']
    to_the_end = await _lines(b'{"a":1}\n{"b":2}', Head(200, None, False, False))
    assert to_the_end == [b'{"a":1}', b'{"b":2}']
