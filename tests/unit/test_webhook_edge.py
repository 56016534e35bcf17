"""The webhook's review route without Litestar (server.py `webhook_app`): a body that has arrived
is taken at once, one still on its way or in pieces is read as every route reads it, and a refusal
is the same JSON error the Litestar route gives."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
import pytest

from tfusion.controller.webhook.server import PATH, AdmissionRequest, AdmissionResponse, allowed, webhook_app

pytestmark = pytest.mark.anyio

REVIEW = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "u-1", "operation": "CREATE", "object": {"metadata": {"name": "p"}}}})


async def echo(request: AdmissionRequest) -> AdmissionResponse:
    return allowed(request.uid, "cGF0Y2g=")


def scope(length: int | None, method: str = "POST") -> dict[str, Any]:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "https",
            "path": PATH, "raw_path": PATH.encode(), "query_string": b"", "root_path": "", "headers": headers,
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 443), "state": {}}


async def call(receive: Any, length: int | None = len(REVIEW), method: str = "POST") -> tuple[int, Any]:
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await webhook_app(echo)(scope(length, method), receive, send)
    return sent[0]["status"], orjson.loads(sent[-1]["body"])


async def test_a_body_already_received_is_answered() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": REVIEW, "more_body": False}

    status, answer = await call(receive)
    assert status == 200 and answer["response"] == {"uid": "u-1", "allowed": True, "patchType": "JSONPatch",
                                                    "patch": "cGF0Y2g="}


async def test_a_body_still_on_its_way_and_one_in_pieces_are_read_whole() -> None:
    arrived = anyio.Event()
    pieces = [REVIEW[:10], REVIEW[10:]]

    async def late() -> dict[str, Any]:
        await arrived.wait()
        piece = pieces.pop(0)
        return {"type": "http.request", "body": piece, "more_body": bool(pieces)}

    async with anyio.create_task_group() as tg:
        async def answer() -> None:
            status, body = await call(late)
            assert status == 200 and body["response"]["allowed"] is True
            tg.cancel_scope.cancel()

        tg.start_soon(answer)
        await anyio.sleep(0.01)  # the route is waiting on its first message by now; either way it must answer
        arrived.set()
        await anyio.sleep(5)
        pytest.fail("no answer")
    assert not pieces


async def test_refusals_are_the_edge_json_errors() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{not json", "more_body": False}

    status, body = await call(receive, 9)
    assert status == 400 and body["field"] == "body" and "not JSON" in body["error"]
    status, body = await call(receive, 10**9)
    assert status == 413, body
    status, body = await call(receive, 9, method="PUT")
    assert status == 405 and body["allowed"] == ["POST"]
