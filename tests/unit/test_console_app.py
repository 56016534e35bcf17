"""The console's HTTP side in-process: pages, live fragments, bad parameters, the token, escaping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tfusion.console.app import TOKEN_COOKIE, console_app
from tfusion.console.cache import StaticCluster
from tfusion.kube import resources as r

pytestmark = pytest.mark.anyio
TOKEN = "a-token-of-sixteen-or-more"


def events(message: str) -> list[dict[str, Any]]:
    return [{"metadata": {"name": "e", "namespace": "default"}, "type": "Warning", "reason": "Odd",
             "message": message, "lastTimestamp": "2026-12-01T10:00:00Z",
             "reportingComponent": "tensor-fusion-operator",
             "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}}]


@pytest.fixture
def cluster() -> StaticCluster:
    return StaticCluster({r.EVENTS: events("<script>alert(1)</script> happened")})


async def client_for(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console")


@pytest.fixture
async def http(cluster: StaticCluster) -> AsyncIterator[httpx.AsyncClient]:
    async with await client_for(console_app(cluster, controller=None, history=None,
                                            controller_error="no controller here")) as client:
        yield client


@pytest.mark.parametrize("path", ["/", "/gpus", "/workloads", "/pending", "/quotas", "/events", "/usage"])
async def test_every_page_renders_with_its_navigation(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert f'href="{path}" aria-current="page"' in response.text
    assert "Controller: no controller here" in response.text


async def test_a_fragment_is_204_while_unchanged_and_new_after_a_change(
        http: httpx.AsyncClient, cluster: StaticCluster) -> None:
    first = await http.get("/events", params={"fragment": "1"})
    etag = first.headers["etag"]
    assert first.status_code == 200 and "<html" not in first.text and "happened" in first.text
    assert (await http.get("/events", params={"fragment": "1", "since": etag})).status_code == 204
    cluster.replace(r.EVENTS, events("something new"))
    changed = await http.get("/events", params={"fragment": "1", "since": etag})
    assert changed.status_code == 200 and "something new" in changed.text and changed.headers["etag"] != etag


async def test_text_from_the_cluster_is_escaped(http: httpx.AsyncClient) -> None:
    page = (await http.get("/events")).text
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize(("path", "params", "field"), [
    ("/workloads", {"sort": "size"}, "sort"), ("/usage", {"window": "year"}, "window"),
    ("/usage", {"metric": "joules"}, "metric"), ("/events", {"type": "Error"}, "type"),
    ("/gpus", {"page": "-1"}, "page")])
async def test_bad_parameters_are_400_naming_the_field(http: httpx.AsyncClient, path: str, params: dict[str, str],
                                                       field: str) -> None:
    response = await http.get(path, params=params)
    assert response.status_code == 400 and response.json()["error"].startswith(f"{field}: ")


async def test_usage_without_a_source_says_how_to_configure_one(http: httpx.AsyncClient) -> None:
    assert "no metrics source is configured" in (await http.get("/usage")).text


async def test_static_assets_ship_in_the_package(http: httpx.AsyncClient) -> None:
    css, js = await http.get("/static/console.css"), await http.get("/static/console.js")
    assert css.status_code == js.status_code == 200 and "fragment" in js.text and "svg.bar" in css.text
    assert (await http.get("/static/nope.js")).status_code == 404


async def test_the_token_is_required_and_then_remembered(cluster: StaticCluster) -> None:
    app = console_app(cluster, controller=None, history=None, token=TOKEN)
    async with await client_for(app) as http:
        refused = await http.get("/gpus")
        assert refused.status_code == 401 and "token" in refused.json()["error"]
        assert (await http.get("/gpus", params={"token": "wrong-token-wrong-token"})).status_code == 401
        accepted = await http.get("/gpus", params={"token": TOKEN, "pool": "a"})
        assert accepted.status_code == 303 and accepted.headers["location"] == "/gpus?pool=a"
        assert f"{TOKEN_COOKIE}={TOKEN}" in accepted.headers["set-cookie"]
        assert "HttpOnly" in accepted.headers["set-cookie"]
        http.cookies.set(TOKEN_COOKIE, TOKEN)
        assert (await http.get("/gpus")).status_code == 200
    async with await client_for(app) as http:
        assert (await http.get("/", headers={"Authorization": f"Bearer {TOKEN}"})).status_code == 200
