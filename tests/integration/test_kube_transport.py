"""KubeClient's lean transport (tfusion/leanhttp.py) against the embedded API server over
HTTPS: small requests go over kept-alive connections, answers and errors read as through kr8s, a
401 is handed back to kr8s (which re-reads the token), and a kept-alive connection the server
closed is retried for a repeatable request and reported for any other."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tfusion.kube import resources as r
from tfusion.kube.client import AlreadyExists, KubeClient, NotFound, ServerError

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
