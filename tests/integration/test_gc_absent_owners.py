"""The embedded garbage collector collects dependents whose owner is already gone when they name it
(a uid that never existed, an owner deleted before the reference was written), keeps a dependent
that still has a live owner (dropping only the dangling reference), and leaves alone a reference to
a kind this server does not serve (it cannot be verified)."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest

pytestmark = pytest.mark.anyio

CMS = "/api/v1/namespaces/default/configmaps"


@pytest.fixture
async def http(apiserver: Any) -> Any:
    async with apiserver.http(timeout=10) as client:
        yield client


async def gone(http: httpx.AsyncClient, name: str, timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while (await http.get(f"{CMS}/{name}")).status_code != 404:
            await anyio.sleep(0.02)


def ref(name: str, uid: str, *, kind: str = "ConfigMap", api_version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid}


async def test_a_reference_to_a_uid_that_never_existed_is_collected(http: httpx.AsyncClient) -> None:
    created = await http.post(CMS, json={"metadata": {"name": "orphan", "ownerReferences": [
        ref("nobody", str(uuid.uuid4()))]}})
    assert created.status_code == 201, created.text
    await gone(http, "orphan")


async def test_a_reference_written_after_the_owner_was_deleted_is_collected(http: httpx.AsyncClient) -> None:
    owner = (await http.post(CMS, json={"metadata": {"name": "late-owner"}})).json()
    await http.post(CMS, json={"metadata": {"name": "late-child"}})
    assert (await http.delete(f"{CMS}/late-owner")).status_code == 200
    # the adoption comes after the owner's deletion, as a controller working from a stale cache writes it
    patched = await http.patch(f"{CMS}/late-child", headers={"Content-Type": "application/merge-patch+json"},
                               json={"metadata": {"ownerReferences": [ref("late-owner", owner["metadata"]["uid"])]}})
    assert patched.status_code == 200, patched.text
    await gone(http, "late-child")


async def test_a_live_owner_keeps_the_dependent_and_only_the_dangling_reference_goes(
        http: httpx.AsyncClient) -> None:
    live = (await http.post(CMS, json={"metadata": {"name": "live"}})).json()
    dead = str(uuid.uuid4())
    await http.post(CMS, json={"metadata": {"name": "two-owners", "ownerReferences": [
        ref("live", live["metadata"]["uid"]), ref("dead", dead)]}})
    with anyio.fail_after(10):
        while True:
            refs = (await http.get(f"{CMS}/two-owners")).json()["metadata"].get("ownerReferences") or []
            if [r["uid"] for r in refs] == [live["metadata"]["uid"]]:
                break
            await anyio.sleep(0.02)


async def test_a_reference_to_a_kind_not_served_is_left_alone(http: httpx.AsyncClient) -> None:
    await http.post(CMS, json={"metadata": {"name": "foreign", "ownerReferences": [
        ref("x", str(uuid.uuid4()), kind="Widget", api_version="example.com/v1")]}})
    # verifications run in order: once a later dangling reference is collected, the first was looked at
    await http.post(CMS, json={"metadata": {"name": "marker", "ownerReferences": [ref("y", str(uuid.uuid4()))]}})
    await gone(http, "marker")
    assert (await http.get(f"{CMS}/foreign")).status_code == 200


async def test_a_dangling_reference_found_at_start_is_collected(apiserver: Any, http: httpx.AsyncClient) -> None:
    """An owner deleted while no collector ran (a killed process) sends no event again: the
    collector looks at every reference when it starts. Here the owner's kind is not served when the
    reference is written, so it is left alone then; once served, only the restart finds it."""
    from tests.apiserver_fixture import apply_crds

    owner = ref("gone-pool", str(uuid.uuid4()), kind="GPUPool", api_version="tensor-fusion.ai/v1")
    await http.post(CMS, json={"metadata": {"name": "from-before", "ownerReferences": [owner]}})
    await apply_crds(apiserver)
    await http.post(CMS, json={"metadata": {"name": "marker-2", "ownerReferences": [ref("z", str(uuid.uuid4()))]}})
    await gone(http, "marker-2")
    assert (await http.get(f"{CMS}/from-before")).status_code == 200
    await anyio.to_thread.run_sync(apiserver.restart)
    async with apiserver.http(timeout=10) as again:
        await gone(again, "from-before")
