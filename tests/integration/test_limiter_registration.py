"""The limiter registers its process with the hypervisor (`POST /api/v1/process`, the pod's token):
against a real hypervisor (Kubernetes backend, embedded API server, simulated GPUs) a CUDA program
under the preloaded limiter appears in its pod's shared-memory PID set; a refused token, an
unreachable hypervisor and one that never answers each cost one line on stderr and nothing else."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import c as creader
from tests import fake_cuda
from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tests.helpers import eventually
from tests.helpers.soft_isolation import NODE, hypervisor, setup_node
from tfusion.api import annotations as tfa
from tfusion.hypervisor.shm.state import DeviceConfig, SharedState
from tfusion.hypervisor.shm.store import ShmStore
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import PODS

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(fake_cuda.gcc() is None or fake_cuda.make() is None,
                                 reason="building the limiter needs gcc and make")]

NOT_YET = (AssertionError, NotFound, KeyError, FileNotFoundError, RuntimeError)
MIB = 1 << 20
NOT_REGISTERED = "is not registered (the hypervisor still finds it through /proc)"


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> fake_cuda.Binaries:
    return fake_cuda.build(tmp_path_factory.mktemp("limiter"))


@pytest.fixture(scope="module")
def reader(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return creader.build(tmp_path_factory.mktemp("shm-reader"))


class HeldProbe:
    """A probe holding one allocation until stdin closes, its stderr in a file the test can poll."""

    def __init__(self, binaries: fake_cuda.Binaries, shm: Path, stderr: Path, **extra: str) -> None:
        self.stderr_path = stderr
        self._stderr = stderr.open("w")
        self.process = subprocess.Popen(
            [str(binaries.probe_linked), "alloc", "plain", str(MIB), "1", "hold"],
            env=fake_cuda.environment(binaries, shm, **extra), stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)

    def stderr_lines(self) -> list[str]:
        return self.stderr_path.read_text().splitlines()

    def finish(self) -> list[dict[str, Any]]:
        """Let it free and exit; its JSON lines (it must exit 0)."""
        out, _ = self.process.communicate(timeout=30)
        self._stderr.close()
        assert self.process.returncode == 0, self.stderr_path.read_text()
        return [json.loads(line) for line in out.splitlines()]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stderr.close()


def pod_env(port: int, token: Path) -> dict[str, str]:
    return {"HYPERVISOR_IP": "127.0.0.1", "HYPERVISOR_PORT": str(port), "TF_LIMITER_TOKEN_PATH": str(token),
            "POD_NAME": "soft-reg", "POD_NAMESPACE": "default", "CONTAINER_NAME": "main"}


async def test_a_limited_process_registers_with_the_real_hypervisor(apiserver: ApiServerHandle, tmp_path: Path,
                                                                    binaries: fake_cuda.Binaries,
                                                                    reader: Path) -> None:
    await apply_crds(apiserver)
    kube = await KubeClient.connect(apiserver.kubeconfig)
    probes: list[HeldProbe] = []
    try:
        await setup_node(kube)
        async with hypervisor(apiserver, tmp_path) as http:
            h100 = (await http.get("/api/v1/devices")).json()["data"][2]["UUID"]
            pod = await kube.create(PODS, {
                "metadata": {"name": "soft-reg", "namespace": "default", "labels": {tfa.COMPONENT: "worker"},
                             "annotations": {tfa.GPU_IDS: h100, tfa.GPU_POOL: "pool-soft", tfa.ISOLATION: "soft",
                                             tfa.TFLOPS_REQUEST: "100", tfa.VRAM_REQUEST: "8Gi",
                                             tfa.TFLOPS_LIMIT: "200", tfa.VRAM_LIMIT: "16Gi"}},
                "spec": {"nodeName": NODE, "serviceAccountName": "default",
                         "containers": [{"name": "main", "image": "busybox"}]}})
            shm = tmp_path / "shm" / "default" / "soft-reg" / "shm"

            async def written() -> bool:
                assert creader.run(reader, shm)["devices"]
                return True

            await eventually(written, 15, retry_on=NOT_YET)
            assert creader.run(reader, shm)["pids"] == []
            token = tmp_path / "token"
            token.write_text(await kube.request_token("default", "default", bound_pod={
                "name": "soft-reg", "uid": pod["metadata"]["uid"]}) + "\n")
            port = http.base_url.port
            assert port is not None
            foreign = tmp_path / "foreign-token"
            foreign.write_text("not-a-token")

            refused = HeldProbe(binaries, shm, tmp_path / "refused.err", **pod_env(port, foreign))
            probes.append(refused)
            registered = HeldProbe(binaries, shm, tmp_path / "registered.err", **pod_env(port, token))
            probes.append(registered)

            async def in_pid_set() -> bool:
                assert registered.process.pid in creader.run(reader, shm)["pids"]
                return True

            await eventually(in_pid_set, 20, "the registered probe's PID in the shm PID set", retry_on=NOT_YET)

            async def refusal_said() -> list[str]:
                lines = [line for line in refused.stderr_lines() if NOT_REGISTERED in line]
                assert lines
                return lines

            said = await eventually(refusal_said, 20, retry_on=NOT_YET)
            assert f"[{refused.process.pid}]" in said[0] and "answered 401" in said[0], said
            assert refused.process.pid not in creader.run(reader, shm)["pids"]

            for probe in (registered, refused):
                assert probe.finish()[0] == {"granted": 1, "refused": 0}, "the program ran on"
            assert not [line for line in registered.stderr_lines() if "registered" in line]
            assert len([line for line in refused.stderr_lines() if "registered" in line]) == 1
    finally:
        for probe in probes:
            probe.kill()
        await kube.close()


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[SharedState]:
    state = ShmStore(tmp_path / "shm").create("ns", "pod", [DeviceConfig(
        slot=0, uuid=fake_cuda.DEVICE_UUID.format(0), up_limit=100, mem_limit=16 * MIB, total_cuda_cores=128)])
    yield state
    state.close()


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def _one_line_and_runs_on(probe: HeldProbe, why: str) -> str:
    async def said() -> list[str]:
        lines = [line for line in probe.stderr_lines() if NOT_REGISTERED in line]
        assert lines
        return lines

    lines = await eventually(said, 20, retry_on=(AssertionError,))
    assert probe.finish()[0] == {"granted": 1, "refused": 0}
    assert probe.stderr_lines() == lines and len(lines) == 1, probe.stderr_lines()
    assert why in lines[0] and f"process {probe.process.pid}" in lines[0], lines[0]
    return lines[0]


async def test_an_unreachable_hypervisor_costs_one_line(tmp_path: Path, binaries: fake_cuda.Binaries,
                                                        shm: SharedState) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    probe = HeldProbe(binaries, shm.path, tmp_path / "err", **pod_env(closed_port(), token))
    try:
        line = await _one_line_and_runs_on(probe, "cannot reach the hypervisor at 127.0.0.1:")
        assert "Connection refused" in line
    finally:
        probe.kill()


async def test_a_silent_hypervisor_costs_one_line_after_the_timeout(tmp_path: Path, binaries: fake_cuda.Binaries,
                                                                    shm: SharedState) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    with socket.socket() as silent:  # accepts (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        probe = HeldProbe(binaries, shm.path, tmp_path / "err", **pod_env(silent.getsockname()[1], token))
        try:
            await _one_line_and_runs_on(probe, "no answer from the hypervisor at 127.0.0.1:")
        finally:
            probe.kill()


async def test_a_missing_token_costs_one_line(tmp_path: Path, binaries: fake_cuda.Binaries,
                                              shm: SharedState) -> None:
    probe = HeldProbe(binaries, shm.path, tmp_path / "err", **pod_env(closed_port(), tmp_path / "absent"))
    try:
        await _one_line_and_runs_on(probe, "cannot read the pod's token")
    finally:
        probe.kill()


def test_without_hypervisor_ip_nothing_is_attempted(tmp_path: Path, binaries: fake_cuda.Binaries,
                                                    shm: SharedState) -> None:
    env = fake_cuda.environment(binaries, shm.path, CONTAINER_NAME="main")
    env.pop("HYPERVISOR_IP", None)
    lines, errors = fake_cuda.run(binaries.probe_linked, ["alloc", "plain", str(MIB), "1"], env)
    assert lines[0] == {"granted": 1, "refused": 0} and errors == ""
