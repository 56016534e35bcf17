"""What the running hypervisor leaves on disk and who may read it (issue 23): the local backend's
state files and worker logs (commands, env, output) are 0600 in 0700 directories and temp copies
left by a crash are removed at start; a soft worker pod's shared-memory file belongs to the identity
its securityContext names (else to root alone, until the limiter registers a process: then to that
process's user); the device plugins' sockets are 0600, in a directory created 0700, while a kubelet
directory that already exists keeps its mode.

Every test runs under umask 0, so each mode asserted is one the hypervisor set, not one the umask
narrowed."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually, file_mode, widest_umask
from tests.helpers.device_plugin import RESOURCES, FakeKubelet
from tests.helpers.device_plugin import hypervisor as plugin_hypervisor
from tests.helpers.local_hypervisor import hypervisor as local_hypervisor
from tests.helpers.soft_isolation import hypervisor as soft_hypervisor
from tests.helpers.soft_isolation import setup_node
from tfusion.api import annotations as tfa
from tfusion.kube.client import KubeClient
from tfusion.kube.resources import PODS

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def open_umask() -> Iterator[None]:
    with widest_umask():
        yield


async def exists(path: Path) -> bool:
    return await anyio.to_thread.run_sync(path.exists)


async def test_local_state_files_and_worker_logs_are_private(short_tmp_path: Path) -> None:
    state = short_tmp_path / "state"  # does not exist yet: the hypervisor creates it
    log_file = state / "logs" / "team-a" / "worker-train.log"
    async with local_hypervisor(state) as http:
        created = await http.post("/api/v1/workers", json={
            "name": "train", "namespace": "team-a", "env": {"API_KEY": "s3cret"},
            "command": ["sh", "-c", "echo started; exec sleep 60"]})
        assert created.status_code == 201, created.text
        await eventually(lambda: anyio.to_thread.run_sync(
            lambda: log_file.exists() and "started" in log_file.read_text()))
        assert "s3cret" in (state / "workers.json").read_text()  # what makes the file worth hiding
        assert {p.name: file_mode(p) for p in state.iterdir() if p.is_file()} == {
            "workers.json": 0o600, "devices.json": 0o600}
        assert [file_mode(p) for p in (state, state / "logs", state / "logs" / "team-a")] == [0o700] * 3
        assert file_mode(log_file) == 0o600
        shm = state / "shm" / "team-a" / "train" / "shm"  # a soft worker (the default) of our own user
        await eventually(lambda: exists(shm))
        assert file_mode(shm) == 0o600 and file_mode(shm.parent) == 0o700 and file_mode(shm.parent.parent) == 0o700

    # what a kill -9 between writing a temp copy and renaming it leaves, and files of an older run
    leftovers = [state / "workers.json.k3j2x9.tmp", state / "devices.json.a8b7c6.tmp"]
    for leftover in leftovers:
        leftover.write_text("{")
    os.chmod(log_file, 0o644)
    unrelated = state / "notes.tmp"
    unrelated.write_text("mine")
    async with local_hypervisor(state) as http:
        assert not any(leftover.exists() for leftover in leftovers)
        assert unrelated.exists()
        restored = (await http.get("/api/v1/workers")).json()["data"]
        assert [w["WorkerInfo"]["WorkerName"] for w in restored] == ["train"]
        await eventually(lambda: anyio.to_thread.run_sync(lambda: file_mode(log_file) == 0o600))
        assert json.loads((state / "workers.json").read_text())[0]["WorkerName"] == "train"
        assert file_mode(state / "workers.json") == 0o600


async def soft_pod(kube: KubeClient, name: str, gpu: str, security: dict[str, int]) -> None:
    await kube.create(PODS, {
        "metadata": {"name": name, "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                     "annotations": {tfa.GPU_IDS: gpu, tfa.GPU_POOL: "pool-soft",
                                     tfa.ISOLATION: "soft", tfa.TFLOPS_REQUEST: "100",
                                     tfa.VRAM_REQUEST: "8Gi"}},
        "spec": {"nodeName": "gpu-node-soft", "securityContext": security,
                 "containers": [{"name": "main", "image": "busybox"}]}})


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to the pod's user needs root, as the DaemonSet runs")
async def test_a_soft_pods_file_belongs_to_its_identity(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    children: list[subprocess.Popen[bytes]] = []
    try:
        await setup_node(kube)
        async with soft_hypervisor(apiserver, short_tmp_path) as http:
            gpu = (await http.get("/api/v1/devices")).json()["data"][0]["UUID"]
            await soft_pod(kube, "runs-as-4100", gpu, {"runAsUser": 4100, "runAsGroup": 4300, "fsGroup": 4200})
            await soft_pod(kube, "runs-as-image-user", gpu, {})
            shm = short_tmp_path / "shm" / "default"
            ours, unknown = shm / "runs-as-4100" / "shm", shm / "runs-as-image-user" / "shm"
            await eventually(lambda: anyio.to_thread.run_sync(lambda: ours.exists() and unknown.exists()))
            info = os.stat(ours)
            assert (info.st_uid, info.st_gid, file_mode(ours)) == (4100, 4200, 0o660)
            info = os.stat(ours.parent)
            assert (info.st_uid, info.st_gid, file_mode(ours.parent)) == (4100, 4200, 0o750)
            assert file_mode(shm) == 0o700 and file_mode(short_tmp_path / "shm") == 0o700
            info = os.stat(unknown)
            assert (info.st_uid, file_mode(unknown), file_mode(unknown.parent)) == (0, 0o600, 0o700)

            # the image's user shows itself when the limiter registers a process: the file becomes its
            async def register(pod: str, uid: int) -> None:
                child = pod_process(pod, uid)
                children.append(child)
                meta = await kube.get(PODS, pod, namespace="default")
                token = await kube.request_token("default", "default",
                                                 bound_pod={"name": pod, "uid": meta["metadata"]["uid"]})
                answer = (await http.post("/api/v1/process", headers={"Authorization": f"Bearer {token}"},
                                          params={"container_name": "main", "container_pid": str(child.pid)})).json()
                assert answer["success"] is True, answer

            await register("runs-as-image-user", 4500)
            assert [(os.stat(p).st_uid, file_mode(p)) for p in (unknown, unknown.parent)] == [
                (4500, 0o600), (4500, 0o700)]
            await register("runs-as-image-user", 4600)  # only the first: no process takes it from another
            await register("runs-as-4100", 4600)  # a pod that names its user keeps it
            assert os.stat(unknown).st_uid == 4500 and (os.stat(ours).st_uid, os.stat(ours).st_gid) == (4100, 4200)
    finally:
        for child in children:
            child.kill()
            child.wait()
        await kube.close()


def pod_process(pod: str, uid: int) -> subprocess.Popen[bytes]:
    """A process of user `uid` that /proc shows as the pod's container `main` (as the limiter's is)."""
    env = {"POD_NAME": pod, "POD_NAMESPACE": "default", "CONTAINER_NAME": "main"}
    return subprocess.Popen(["/bin/sleep", "60"], env=env, user=uid, group=uid, extra_groups=[])


async def test_device_plugin_sockets_are_private(apiserver: ApiServerHandle, short_tmp_path: Path) -> None:
    await apply_crds(apiserver)
    for plugin_dir, dir_mode in ((short_tmp_path / "created-by-us", 0o700), (short_tmp_path / "kubelets", 0o755)):
        if dir_mode == 0o755:  # the kubelet's directory, there before the hypervisor
            plugin_dir.mkdir(mode=dir_mode)
        async with plugin_hypervisor(apiserver, short_tmp_path / f"state-{plugin_dir.name}", plugin_dir):
            await eventually(functools.partial(exists, plugin_dir))
            kubelet = FakeKubelet(plugin_dir)
            await kubelet.start()
            try:
                async def registered(k: FakeKubelet = kubelet) -> bool:
                    return sorted({r.resource_name for r in k.registrations}) == sorted(RESOURCES)

                await eventually(registered, timeout=20)
                sockets = sorted(plugin_dir.glob("tensor-fusion-index-*.sock"))
                assert len(sockets) == 16
                assert {p.name: file_mode(p) for p in sockets} == {p.name: 0o600 for p in sockets}
                assert file_mode(plugin_dir) == dir_mode
            finally:
                await kubelet.stop()
