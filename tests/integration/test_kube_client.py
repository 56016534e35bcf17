"""KubeClient against the embedded API server over HTTP: CRUD, patches, pagination, typed errors,
watch (including 410), the QPS limit, and transport failures."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tfusion.kube import resources as r
from tfusion.kube.client import (
    AlreadyExists,
    BadRequest,
    Conflict,
    Gone,
    Invalid,
    KubeClient,
    NotFound,
    ServerError,
    Unauthorized,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
async def kube(kube: KubeClient) -> KubeClient:
    """The shared client (tests/apiserver_fixture.py), with this module's namespace created."""
    await kube.create(r.NAMESPACES, {"metadata": {"name": "t"}})
    return kube


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "t", "labels": {"app": "x"}}, "data": data}


async def test_create_get_list_paginated(kube: KubeClient) -> None:
    for i in range(7):
        created = await kube.create(r.CONFIGMAPS, cm(f"c{i}", i=str(i)))
        assert created["metadata"]["resourceVersion"]
    got = await kube.get(r.CONFIGMAPS, "c3", namespace="t")
    assert got["data"] == {"i": "3"}
    listed = await kube.list(r.CONFIGMAPS, namespace="t", limit=3)
    assert sorted(o["metadata"]["name"] for o in listed) == [f"c{i}" for i in range(7)]
    assert listed.resource_version
    assert len(await kube.list(r.CONFIGMAPS, namespace="t", label_selector="app=x")) == 7
    assert len(await kube.list(r.CONFIGMAPS, namespace="t", label_selector="app=y")) == 0
    assert len(await kube.list(r.CONFIGMAPS, namespace="t", field_selector="metadata.name=c5")) == 1


async def test_typed_errors_carry_the_server_message(kube: KubeClient) -> None:
    await kube.create(r.CONFIGMAPS, cm("a"))
    with pytest.raises(AlreadyExists) as exists:
        await kube.create(r.CONFIGMAPS, cm("a"))
    assert exists.value.code == 409 and exists.value.reason == "AlreadyExists"
    assert "a" in exists.value.message and exists.value.status["kind"] == "Status"
    with pytest.raises(NotFound) as missing:
        await kube.get(r.CONFIGMAPS, "nope", namespace="t")
    assert missing.value.code == 404 and "nope" in missing.value.message
    with pytest.raises(Invalid) as invalid:
        await kube.create(r.CONFIGMAPS, {"metadata": {"namespace": "t"}, "data": {}})
    assert invalid.value.code == 422 and invalid.value.message
    with pytest.raises(BadRequest):
        await kube.patch(r.CONFIGMAPS, "a", b"{not json", namespace="t")


async def test_replace_is_conditioned_on_resource_version(kube: KubeClient) -> None:
    first = await kube.create(r.CONFIGMAPS, cm("rv", v="1"))
    second = await kube.replace(r.CONFIGMAPS, {**first, "data": {"v": "2"}})
    assert second["data"] == {"v": "2"}
    with pytest.raises(Conflict) as stale:
        await kube.replace(r.CONFIGMAPS, {**first, "data": {"v": "3"}})
    assert stale.value.code == 409 and not isinstance(stale.value, AlreadyExists)
    assert (await kube.get(r.CONFIGMAPS, "rv", namespace="t"))["data"] == {"v": "2"}


async def test_patch_types_and_status_subresource(kube: KubeClient) -> None:
    await kube.create(r.CONFIGMAPS, cm("p", a="1"))
    merged = await kube.patch(r.CONFIGMAPS, "p", {"data": {"b": "2"}}, namespace="t")
    assert merged["data"] == {"a": "1", "b": "2"}
    jsoned = await kube.patch(r.CONFIGMAPS, "p", [{"op": "remove", "path": "/data/a"}], namespace="t",
                              patch_type="json")
    assert jsoned["data"] == {"b": "2"}
    strategic = await kube.patch(r.CONFIGMAPS, "p", {"data": {"c": "3"}}, namespace="t", patch_type="strategic")
    assert strategic["data"] == {"b": "2", "c": "3"}
    with pytest.raises(ValueError, match="patch_type 'yaml'"):
        await kube.patch(r.CONFIGMAPS, "p", {}, namespace="t", patch_type="yaml")

    pod = {"metadata": {"name": "pod", "namespace": "t"},
           "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    await kube.create(r.PODS, pod)
    patched = await kube.patch(r.PODS, "pod", {"status": {"phase": "Running"},
                                               "spec": {"nodeName": "ignored-on-status"}},
                               namespace="t", subresource="status")
    assert patched["status"]["phase"] == "Running"
    assert "nodeName" not in patched["spec"], "a status patch must not change the spec"


async def test_delete_with_preconditions_and_propagation(kube: KubeClient) -> None:
    created = await kube.create(r.CONFIGMAPS, cm("d"))
    with pytest.raises(Conflict):
        await kube.delete(r.CONFIGMAPS, "d", namespace="t", preconditions={"uid": "not-the-uid"})
    await kube.delete(r.CONFIGMAPS, "d", namespace="t", preconditions={"uid": created["metadata"]["uid"]},
                      propagation_policy="Foreground")
    with pytest.raises(NotFound):
        await kube.get(r.CONFIGMAPS, "d", namespace="t")


async def test_watch_from_list_and_server_timeout(kube: KubeClient) -> None:
    listed = await kube.list(r.CONFIGMAPS, namespace="t")
    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        async with contextlib.aclosing(kube.watch(r.CONFIGMAPS, namespace="t",
                                                  resource_version=listed.resource_version,
                                                  timeout_seconds=1)) as events:
            async for kind, obj in events:
                if kind != "BOOKMARK":
                    seen.append((kind, obj["metadata"]["name"]))

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        await anyio.sleep(0.1)
        await kube.create(r.CONFIGMAPS, cm("w"))
        await kube.patch(r.CONFIGMAPS, "w", {"data": {"x": "1"}}, namespace="t")
        await kube.delete(r.CONFIGMAPS, "w", namespace="t")
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]
    assert time.monotonic() - started < 5, "timeoutSeconds=1 must end the stream"


async def test_watch_from_compacted_version_raises_gone(apiserver: Any, kube: KubeClient) -> None:
    old = (await kube.list(r.CONFIGMAPS, namespace="t")).resource_version
    await kube.create(r.CONFIGMAPS, cm("g"))
    apiserver.compact()
    with pytest.raises(Gone) as gone:
        async with contextlib.aclosing(kube.watch(r.CONFIGMAPS, namespace="t", resource_version=old,
                                                  timeout_seconds=2)) as events:
            async for _ in events:
                pass
    assert gone.value.code == 410


async def test_client_side_qps_limit(apiserver: Any) -> None:
    client = await KubeClient.connect(str(apiserver.kubeconfig), qps=20, burst=2)
    try:
        started = time.monotonic()
        for _ in range(12):
            await client.list(r.NAMESPACES)
        # 2 from the burst, then 10 at 20/s: at least 0.5 s
        assert time.monotonic() - started >= 0.45
    finally:
        await client.close()


def dead_kubeconfig(apiserver: Any, tmp_path: Path) -> Path:
    """The fixture's kubeconfig pointed at a port nothing listens on."""
    config = yaml.safe_load(Path(apiserver.kubeconfig).read_text())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config["clusters"][0]["cluster"]["server"] = f"http://127.0.0.1:{port}"
    path = tmp_path / "dead-kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


async def test_no_server_is_a_server_error(tmp_path: Path, apiserver: Any) -> None:
    with pytest.raises(ServerError) as failed:
        await KubeClient.connect(str(dead_kubeconfig(apiserver, tmp_path)))
    assert failed.value.code == 0 and "no answer" in failed.value.message


async def test_connect_rejects_a_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no kubeconfig file"):
        await KubeClient.connect(str(tmp_path / "missing"))


async def test_in_cluster_uses_the_service_account_and_the_given_namespace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pod: the API server from KUBERNETES_SERVICE_HOST/PORT over HTTPS, token and CA from
    the service-account directory. Here an embedded server in TLS mode plays the cluster."""
    from tfusion.apiserver.embedded import EmbeddedApiServer

    async with EmbeddedApiServer(tmp_path / "tls.db", listen="127.0.0.1:0", tls=True) as server:
        assert server.token and server.ca_pem
        sa_dir = tmp_path / "serviceaccount"
        sa_dir.mkdir()
        (sa_dir / "token").write_text(server.token)
        (sa_dir / "ca.crt").write_bytes(server.ca_pem)
        (sa_dir / "namespace").write_text("from-the-file")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / "must-not-be-used"))
        client = await KubeClient.connect("in-cluster", namespace="tf-pod-ns", service_account_dir=str(sa_dir))
        try:
            assert client.namespace == "tf-pod-ns"
            assert client.api.auth.server == f"https://127.0.0.1:{server.port}"
            await client.create(r.NAMESPACES, {"metadata": {"name": "tf-pod-ns"}})
            created = await client.create(r.CONFIGMAPS, {"metadata": {"name": "x"}, "data": {}})
            assert created["metadata"]["namespace"] == "tf-pod-ns", "objects land in the pod's namespace"
        finally:
            await client.close()
        bad_dir = tmp_path / "bad-serviceaccount"
        bad_dir.mkdir()
        (bad_dir / "token").write_text("not-the-token")
        (bad_dir / "ca.crt").write_bytes(server.ca_pem)
        intruder = await KubeClient.connect("in-cluster", namespace="tf-pod-ns", service_account_dir=str(bad_dir))
        try:
            with pytest.raises(Unauthorized) as refused:
                await intruder.list(r.CONFIGMAPS, namespace="tf-pod-ns")
            assert refused.value.code == 401
        finally:
            await intruder.close()
    with pytest.raises(ValueError, match="no service account"):
        await KubeClient.connect("in-cluster", service_account_dir=str(tmp_path / "nowhere"))
