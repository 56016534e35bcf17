"""Finding the controller (tfusion/console/locate.py) against the embedded API server and a real
leading controller: a given URL is used as is; the leader writes `api-url`, `pod` and
`pod-namespace` to its leader-info ConfigMap (a new leader removes keys the previous one wrote and it
has no value for) and a client finds it there; when that URL does not
answer, the port-forward through pods/portforward is refused by the embedded API server (no kubelet)
and the error says so, naming the pod and `--controller`; no ConfigMap, or one without a pod, says
what is missing. `tfusion why` without `--controller` finds the controller the same way, and says
clearly when it cannot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import closed_port, eventually
from tests.helpers.controller import controllers, kube_client, settings_for, start_controller
from tests.helpers.scheduler import gpu_pod, one_gpu_node, scheduled_condition
from tfusion.console.locate import ControllerNotFound, locate_controller
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.leader import LEADER_INFO_CONFIGMAP, LeaderElector

pytestmark = pytest.mark.anyio

OPS = "tf-ops"  # settings_for's operator namespace
LEADER_POD = "tensor-fusion-operator-0"


async def leader_info(kube: KubeClient) -> dict[str, str] | None:
    try:
        return dict((await kube.get(r.CONFIGMAPS, LEADER_INFO_CONFIGMAP, namespace=OPS)).get("data") or {})
    except NotFound:
        return None


async def write_leader_info(kube: KubeClient, data: dict[str, str]) -> None:
    """The ConfigMap as a leader that is gone left it."""
    await kube.create(r.NAMESPACES, {"metadata": {"name": OPS}})
    await kube.create(r.CONFIGMAPS, {"metadata": {"name": LEADER_INFO_CONFIGMAP, "namespace": OPS}, "data": data},
                      namespace=OPS)


async def create_leader_pod(kube: KubeClient) -> None:
    await kube.create(r.PODS, {"metadata": {"name": LEADER_POD, "namespace": OPS},
                               "spec": {"containers": [{"name": "manager", "image": "tfusion"}]}}, namespace=OPS)


async def not_found(kube: KubeClient) -> str:
    with pytest.raises(ControllerNotFound) as caught:
        async with locate_controller(kube, namespace=OPS, timeout_s=1.0):
            pytest.fail("no controller should have been found")
    return str(caught.value)


async def test_a_given_url_is_used_as_is(kube: KubeClient) -> None:
    async with locate_controller(kube, "http://ctl.example:8080/", namespace=OPS) as found:
        assert (found.url, found.how) == ("http://ctl.example:8080", "given")
    assert await leader_info(kube) is None, "a given URL reads nothing from the cluster"
    with pytest.raises(ControllerNotFound, match=r"--controller 'ctl:8080': expected the controller's base URL"):
        async with locate_controller(kube, "ctl:8080", namespace=OPS):
            pytest.fail("not a URL")


async def test_the_leader_writes_its_api_url_and_pod_and_a_client_finds_it(
        apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)
    async with kube_client(apiserver) as kube, controllers() as tg:
        ctl = await start_controller(tg, settings_for(apiserver, tmp_path, leader_elect=True, pod_name=LEADER_POD,
                                                      pod_namespace=OPS))
        assert ctl.runtime.address is not None
        port = ctl.runtime.address[1]

        async def written() -> dict[str, str] | None:
            info = await leader_info(kube)
            return info if info is not None and "api-url" in info else None

        info = await eventually(written, what="the leader info with api-url")
        assert info["api-url"] == f"http://127.0.0.1:{port}", "bound to loopback: the loopback URL"
        assert (info["pod"], info["pod-namespace"]) == (LEADER_POD, OPS)
        assert info["leader-ip"], "kept for the original's followers"

        async with locate_controller(kube, namespace=OPS) as found:
            assert (found.url, found.how) == (f"http://127.0.0.1:{port}", "leader-info")
            async with httpx.AsyncClient(base_url=found.url, timeout=10) as http:
                assert (await http.get("/api/why", params={"name": "nope"})).status_code == 404
        await ctl.stop()


async def test_a_new_leader_removes_what_the_previous_one_wrote_and_it_has_not(kube: KubeClient) -> None:
    await write_leader_info(kube, {"leader-ip": "10.0.0.1", "api-url": "http://10.0.0.1:8080", "pod": "old-0",
                                   "pod-namespace": OPS, "other": "kept"})
    elector = LeaderElector(kube, namespace=OPS, identity="by-hand")
    elector.advertise("127.0.0.1", 9000)
    await elector.write_leader_info("10.0.0.9")
    assert await leader_info(kube) == {"leader-ip": "10.0.0.9", "api-url": "http://127.0.0.1:9000", "other": "kept"}


async def test_an_unreachable_api_url_falls_back_to_a_port_forward_the_embedded_server_refuses(
        kube: KubeClient) -> None:
    dead = f"http://127.0.0.1:{closed_port()}"
    await write_leader_info(kube, {"leader-ip": "127.0.0.1", "api-url": dead, "pod": LEADER_POD,
                                   "pod-namespace": OPS})
    gone = await not_found(kube)
    assert f"the leader's api-url {dead} cannot be reached" in gone
    assert f"pod {OPS}/{LEADER_POD}" in gone and "the pod does not exist" in gone, gone

    await create_leader_pod(kube)
    refused = await not_found(kube)
    port = dead.rsplit(":", 1)[1]
    assert f"a port-forward to pod {OPS}/{LEADER_POD} port {port} failed" in refused, refused
    assert f'pod "{LEADER_POD}" cannot forward ports' in refused, "the API server's own reason"
    assert "no kubelet" in refused, refused
    assert f"pass --controller URL (for example after `kubectl port-forward -n {OPS} pod/{LEADER_POD} 8080:{port}`" \
        in refused


async def test_no_leader_info_or_no_pod_says_what_is_missing(kube: KubeClient) -> None:
    missing = await not_found(kube)
    assert f"ConfigMap {OPS}/{LEADER_INFO_CONFIGMAP}" in missing and "does not exist" in missing
    assert "pass --controller URL" in missing

    await write_leader_info(kube, {"leader-ip": "10.0.0.1"})  # an older controller: no api-url, no pod
    old = await not_found(kube)
    assert "has no api-url" in old and "the leader runs in no pod to port-forward to" in old, old
    assert "pass --controller URL" in old


async def test_tfusion_why_finds_the_controller_without_being_told(apiserver: ApiServerHandle, tmp_path: Path) -> None:
    await apply_crds(apiserver)

    def why(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tfusion", "why", "--kube", str(apiserver.kubeconfig),
                               "--operator-namespace", OPS, *args], capture_output=True, text=True, timeout=60)

    async with kube_client(apiserver) as kube:
        await one_gpu_node(kube, vram="40Gi")
        await kube.create(r.PODS, gpu_pod("big", vram="48Gi"))
        alone = await anyio.to_thread.run_sync(lambda: why("big"))
        assert alone.returncode == 0, alone.stderr
        assert f"no leading controller found: ConfigMap {OPS}/{LEADER_INFO_CONFIGMAP}" in alone.stdout, alone.stdout
        assert "shown: the pod's condition only" in alone.stdout

        async with controllers() as tg:
            ctl = await start_controller(tg, settings_for(apiserver, tmp_path, leader_elect=True,
                                                          pod_name=LEADER_POD, pod_namespace=OPS))
            await eventually(lambda: scheduled_condition(kube, "big"), what="big's PodScheduled condition")

            async def advertised() -> Any:
                return (await leader_info(kube) or {}).get("api-url")

            await eventually(advertised, what="the leader's api-url")
            found = await anyio.to_thread.run_sync(lambda: why("-n", "default", "big"))
            assert found.returncode == 0, found.stderr
            assert "Why: 0/1 nodes are available: 1 GPU VRAM too small." in found.stdout
            node_line = next(line for line in found.stdout.splitlines() if line.startswith("  node-a: "))
            assert "48Gi" in node_line, found.stdout
            assert "shown: the pod's condition only" not in found.stdout, found.stdout
            await ctl.stop()

        await create_leader_pod(kube)
        stale = await anyio.to_thread.run_sync(lambda: why("big"))
        assert stale.returncode == 0, stale.stderr
        assert "Why: 0/1 nodes are available: 1 GPU VRAM too small." in stale.stdout
        assert "cannot forward ports" in stale.stdout and "pass --controller URL" in stale.stdout, stale.stdout
