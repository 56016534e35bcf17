"""Watch semantics of the embedded API server: initial state, resume, 410, bookmarks, timeouts, selectors."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import kr8s.asyncio
import pytest
from kr8s.asyncio.objects import ConfigMap

pytestmark = pytest.mark.anyio

CMS = "/api/v1/namespaces/default/configmaps"
MERGE = {"content-type": "application/merge-patch+json"}


@pytest.fixture
async def http(apiserver: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with apiserver.http(timeout=httpx.Timeout(10, read=15)) as client:
        yield client


async def read_events(
    client: httpx.AsyncClient, path: str, params: dict[str, str], count: int, timeout: float = 5.0
) -> list[dict[str, Any]]:
    """Open a watch, return the first `count` events (or all until the server ends the stream)."""
    events: list[dict[str, Any]] = []
    with anyio.fail_after(timeout):
        async with client.stream("GET", path, params={"watch": "true", **params}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line:
                    events.append(json.loads(line))
                if len(events) >= count:
                    break
    return events


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"].get("metadata", {}).get("name", "")) for e in events]


async def test_watch_from_now_sends_current_state_then_changes(http: httpx.AsyncClient) -> None:
    await http.post(CMS, json={"metadata": {"name": "w1"}})
    async with anyio.create_task_group() as tg:
        result: list[dict[str, Any]] = []

        async def watch() -> None:
            result.extend(await read_events(http, CMS, {}, 4))

        tg.start_soon(watch)
        await anyio.sleep(0.2)
        await http.post(CMS, json={"metadata": {"name": "w2"}})
        await http.patch(f"{CMS}/w1", content=b'{"data":{"a":"b"}}', headers=MERGE)
        await http.delete(f"{CMS}/w2")
    assert summary(result) == [("ADDED", "w1"), ("ADDED", "w2"), ("MODIFIED", "w1"), ("DELETED", "w2")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in result[1:]]
    assert rvs == sorted(rvs)


async def test_watch_resumes_from_resource_version(http: httpx.AsyncClient) -> None:
    first = (await http.post(CMS, json={"metadata": {"name": "r1"}})).json()
    await http.post(CMS, json={"metadata": {"name": "r2"}})
    await http.patch(f"{CMS}/r1", content=b'{"data":{"x":"y"}}', headers=MERGE)
    await http.post("/api/v1/namespaces/kube-system/configmaps", json={"metadata": {"name": "elsewhere"}})
    events = await read_events(http, CMS, {"resourceVersion": first["metadata"]["resourceVersion"]}, 2)
    assert summary(events) == [("ADDED", "r2"), ("MODIFIED", "r1")]
    everywhere = await read_events(
        http, "/api/v1/configmaps", {"resourceVersion": first["metadata"]["resourceVersion"]}, 3
    )
    assert summary(everywhere)[-1] == ("ADDED", "elsewhere")


async def test_compacted_history_gives_410_expired(apiserver: Any, http: httpx.AsyncClient) -> None:
    old = (await http.post(CMS, json={"metadata": {"name": "old"}})).json()["metadata"]["resourceVersion"]
    await http.post(CMS, json={"metadata": {"name": "new"}})
    await anyio.to_thread.run_sync(apiserver.compact)
    events = await read_events(http, CMS, {"resourceVersion": old}, 1)
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["kind"] == "Status" and status["code"] == 410 and status["reason"] == "Expired"
    # a fresh list gives a resourceVersion that can be watched from again
    list_rv = (await http.get(CMS)).json()["metadata"]["resourceVersion"]
    async with anyio.create_task_group() as tg:
        result: list[dict[str, Any]] = []

        async def watch() -> None:
            result.extend(await read_events(http, CMS, {"resourceVersion": list_rv}, 1))

        tg.start_soon(watch)
        await anyio.sleep(0.2)
        await http.post(CMS, json={"metadata": {"name": "after"}})
    assert summary(result) == [("ADDED", "after")]


async def test_history_window_from_settings(tmp_path: Any) -> None:
    from tests.apiserver_fixture import ApiServerHandle

    handle = ApiServerHandle(tmp_path / "s.db", tmp_path / "kc", watch_history=5).start()
    try:
        async with handle.http(timeout=10) as client:
            first = (await client.post(CMS, json={"metadata": {"name": "h0"}})).json()["metadata"]["resourceVersion"]
            for i in range(1, 8):
                await client.post(CMS, json={"metadata": {"name": f"h{i}"}})
            events = await read_events(client, CMS, {"resourceVersion": first}, 1)
            assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410
    finally:
        await anyio.to_thread.run_sync(handle.stop)


async def test_bookmarks_and_timeout(http: httpx.AsyncClient) -> None:
    rv = (await http.get(CMS)).json()["metadata"]["resourceVersion"]
    started = anyio.current_time()
    events = await read_events(
        http, CMS, {"resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "2"}, 100, timeout=6
    )
    elapsed = anyio.current_time() - started
    assert 1.8 <= elapsed < 5.5, elapsed  # the server ended the stream after timeoutSeconds, not our 6 s
    assert events and all(e["type"] == "BOOKMARK" for e in events)
    assert events[0]["object"] == {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    no_bookmarks = await read_events(http, CMS, {"resourceVersion": rv, "timeoutSeconds": "1"}, 100)
    assert no_bookmarks == []


async def test_selector_watch_turns_transitions_into_added_and_deleted(http: httpx.AsyncClient) -> None:
    rv = (await http.get(CMS)).json()["metadata"]["resourceVersion"]
    await http.post(CMS, json={"metadata": {"name": "s1", "labels": {"pick": "yes"}}})
    await http.post(CMS, json={"metadata": {"name": "s2", "labels": {"pick": "no"}}})
    await http.patch(f"{CMS}/s1", content=b'{"metadata":{"labels":{"pick":"no"}}}', headers=MERGE)
    await http.patch(f"{CMS}/s2", content=b'{"metadata":{"labels":{"pick":"yes"}}}', headers=MERGE)
    await http.patch(f"{CMS}/s2", content=b'{"data":{"k":"v"}}', headers=MERGE)
    events = await read_events(http, CMS, {"resourceVersion": rv, "labelSelector": "pick=yes"}, 4)
    assert summary(events) == [("ADDED", "s1"), ("DELETED", "s1"), ("ADDED", "s2"), ("MODIFIED", "s2")]
    named = await read_events(http, CMS, {"resourceVersion": rv, "fieldSelector": "metadata.name=s2"}, 3)
    assert summary(named) == [("ADDED", "s2"), ("MODIFIED", "s2"), ("MODIFIED", "s2")]


async def test_close_watches_ends_streams_cleanly(apiserver: Any, http: httpx.AsyncClient) -> None:
    ended = anyio.Event()

    async def watch() -> None:
        await read_events(http, CMS, {"resourceVersion": "0"}, 1000, timeout=10)
        ended.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.3)
        await anyio.to_thread.run_sync(apiserver.close_watches)
        with anyio.fail_after(3):
            await ended.wait()


async def test_kr8s_watch(apiserver: Any) -> None:
    api = await kr8s.asyncio.api(kubeconfig=apiserver.kubeconfig)
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async for event, obj in api.watch("configmaps", namespace="default"):
            seen.append((event, obj.name))
            if len(seen) == 2:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.3)
        cm = ConfigMap({"metadata": {"name": "kw", "namespace": "default"}}, api=api)
        await cm.create()
        await cm.delete()
    assert seen == [("ADDED", "kw"), ("DELETED", "kw")]


async def test_watch_errors(http: httpx.AsyncClient) -> None:
    bad = await http.get(CMS, params={"watch": "true", "resourceVersion": "abc"})
    assert bad.status_code == 400
    bad_selector = await http.get(CMS, params={"watch": "true", "labelSelector": "a in (b"})
    assert bad_selector.status_code == 400


async def test_legacy_watch_path(http: httpx.AsyncClient) -> None:
    await http.post(CMS, json={"metadata": {"name": "legacy"}})
    events = await read_events(http, "/api/v1/watch/namespaces/default/configmaps", {}, 1)
    assert summary(events) == [("ADDED", "legacy")]
    single = await read_events(http, "/api/v1/watch/namespaces/default/configmaps/legacy", {"timeoutSeconds": "1"}, 5)
    assert summary(single) == [("ADDED", "legacy")]


async def test_watch_list_protocol(http: httpx.AsyncClient) -> None:
    await http.post(CMS, json={"metadata": {"name": "wl"}})
    params = {"sendInitialEvents": "true", "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan"}
    events = await read_events(http, CMS, params, 2)
    assert summary(events) == [("ADDED", "wl"), ("BOOKMARK", "")]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    without_bookmarks = await http.get(CMS, params={"watch": "true", "sendInitialEvents": "true"})
    assert without_bookmarks.status_code == 422
    quiet = await read_events(http, CMS, {"sendInitialEvents": "false", "timeoutSeconds": "1"}, 5)
    assert quiet == []
