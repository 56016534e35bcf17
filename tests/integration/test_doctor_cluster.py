"""`tfusion doctor`'s checks on what a real cluster has and `--role=all` does not, against the
embedded API server: a CRD at an older schema, a webhook behind a Service whose certificate Secret
another CA signed (and no Service, so the API server cannot call it), a stale leader Lease beside
a held kube-scheduler Lease (extender mode), a crash-looping hypervisor pod and a GPU node with none,
a GPU whose available exceeds its capacity, no RBAC for the shipped ServiceAccounts, and an
original TensorFusion operator of an older release, with an environment variable tfusion refuses, one
it takes differently and a mounted dynamic config with a key it takes differently.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
from typing import Any

import pytest

from tests.admission_helpers import CertificateAuthority
from tests.apiserver_fixture import ApiServerHandle, apply_crds
from tfusion.api import crds as tf_crds
from tfusion.api.annotations import INDEX_RESOURCE_PREFIX, INDEX_RESOURCES
from tfusion.api.timestamps import micro_time
from tfusion.controller.webhook.registration import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    client_config,
    desired_configuration,
)
from tfusion.doctor.context import Context
from tfusion.doctor.findings import Finding
from tfusion.doctor.run import run_checks
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient

pytestmark = pytest.mark.anyio

NS = "tensor-fusion-sys"


def _crds_with_an_older_gpupool() -> list[dict[str, Any]]:
    crds: list[dict[str, Any]] = copy.deepcopy(tf_crds.all_crds())
    [pool] = [crd for crd in crds if crd["metadata"]["name"] == "gpupools.tensor-fusion.ai"]
    del pool["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]["phase"]
    return crds


async def _webhook(kube: KubeClient) -> None:
    trusted, signer = CertificateAuthority("trusted-ca"), CertificateAuthority("other-ca")
    cert, key = signer.issue(["tensor-fusion-webhook.tensor-fusion-sys.svc"], [])
    await kube.create(r.SECRETS, {"metadata": {"name": "tensor-fusion-webhook-certs", "namespace": NS},
                                  "data": {"tls.crt": base64.b64encode(cert).decode(),
                                           "tls.key": base64.b64encode(key).decode()}})
    config = client_config(url=None, service=(NS, "tensor-fusion-webhook"), ca_bundle=trusted.bundle)
    await kube.create(MUTATING_WEBHOOK_CONFIGURATIONS, desired_configuration(config, widened=False))


async def _leases(kube: KubeClient) -> None:
    now = dt.datetime.now(dt.UTC)  # when the test runs: a Lease renewed "now" must still be held
    stale = micro_time(now - dt.timedelta(minutes=2))
    for name, renewed in (("85104305.tensor-fusion.ai", stale), ("tensor-fusion-scheduler", micro_time(now))):
        await kube.create(r.LEASES, {"metadata": {"name": name, "namespace": NS},
                                     "spec": {"holderIdentity": f"{name}-holder", "leaseDurationSeconds": 15,
                                              "renewTime": renewed}})


async def _gpu_nodes(kube: KubeClient) -> None:
    index = {f"{INDEX_RESOURCE_PREFIX}{i:x}": "36" for i in range(INDEX_RESOURCES)}
    for name in ("node-a", "node-b"):
        await kube.create(r.NODES, {"metadata": {"name": name}})
        await kube.patch(r.NODES, name, {"status": {"allocatable": index}}, subresource="status")
        await kube.create(r.GPUNODES, {"metadata": {"name": name}, "spec": {"manageMode": "AutoSelect"}})
        await kube.patch(r.GPUNODES, name, {"status": {"phase": "Running", "managedGPUs": 1, "totalGPUs": 1,
                                                       "totalTFlops": "312", "totalVRAM": "80Gi"}},
                         subresource="status")
    await kube.create(r.PODS, {"metadata": {"name": "hypervisor-x", "namespace": NS,
                                            "labels": {"tensor-fusion.ai/component": "hypervisor"}},
                               "spec": {"nodeName": "node-a", "containers": [{"name": "h", "image": "tfusion"}]}})
    await kube.patch(r.PODS, "hypervisor-x", {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "h", "ready": False, "restartCount": 4, "image": "tfusion", "imageID": "",
                               "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}},
        namespace=NS, subresource="status")
    await kube.create(r.GPUS, {"metadata": {"name": "gpu-1"}})
    await kube.patch(r.GPUS, "gpu-1", {"status": {
        "gpuModel": "A100", "message": "", "nodeSelector": {}, "uuid": "gpu-1",
        "capacity": {"tflops": "312", "vram": "80Gi"}, "available": {"tflops": "400", "vram": "80Gi"}}},
        subresource="status")


async def _original_operator(kube: KubeClient) -> None:
    labels = {"app": "tensor-fusion-operator"}
    await kube.create(r.CONFIGMAPS, {"metadata": {"name": "tensor-fusion-config", "namespace": NS},
                                     "data": {"config.yaml": "metricsTTL: 30d\nmetricsFormat: otel\n"}})
    await kube.create(r.DEPLOYMENTS, {"metadata": {"name": "tensor-fusion-operator", "namespace": NS}, "spec": {
        "replicas": 0, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "containers": [{"name": "manager", "image": "tensorfusion/tensor-fusion-operator:1.40",
                            "env": [{"name": "TF_ISOLATION_MODE_POLICY", "value": "sometimes"},
                                    {"name": "NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION", "value": "true"}]}],
            "volumes": [{"name": "config", "configMap": {"name": "tensor-fusion-config"}}]}}}})


def _of(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


async def test_doctor_names_cluster_faults_with_their_fixes(apiserver: ApiServerHandle, kube: KubeClient) -> None:
    await apply_crds(apiserver, _crds_with_an_older_gpupool())
    await _webhook(kube)
    await _leases(kube)
    await _gpu_nodes(kube)
    await _original_operator(kube)

    findings = await run_checks(Context(kube, NS, 8001))
    shown = "\n".join(f"{f.severity} {f.check}: {f.message} | {f.fix}" for f in findings)

    [crd] = _of(findings, "crds")
    assert crd.severity == "error" and "CRD gpupools.tensor-fusion.ai is not at this tfusion's schema" in crd.message
    assert "properties.status.properties.phase: missing on the cluster" in crd.message, shown

    certificate, call = _of(findings, "webhook")
    assert certificate.severity == "error" and "Service tensor-fusion-sys/tensor-fusion-webhook" in certificate.message
    assert "CN=other-ca" in certificate.message and "CN=trusted-ca" in certificate.message, shown
    assert call.severity == "error" and "failed calling webhook" in call.message, shown
    assert "get endpoints tensor-fusion-webhook" in call.fix, shown

    [leader] = _of(findings, "controller")
    assert leader.severity == "error" and "no controller leads" in leader.message, shown
    assert [f.severity for f in _of(findings, "scheduler")] == ["ok"]
    assert "extender mode" in _of(findings, "scheduler")[0].message

    crashing, missing = _of(findings, "hypervisors")
    assert "hypervisor pod tensor-fusion-sys/hypervisor-x on node node-a is not ready (CrashLoopBackOff)" in (
        crashing.message), shown
    assert missing.message == "no hypervisor pod runs on GPU node node-b", shown
    assert [f.severity for f in _of(findings, "device-plugins") + _of(findings, "heartbeats")] == ["ok", "ok"]

    [pool] = _of(findings, "pools")
    assert "GPU gpu-1: tflops available 400 exceeds its capacity 312" in pool.message, shown
    rbac = _of(findings, "rbac")
    assert {f.severity for f in rbac} == {"error"} and len(rbac) == 2, shown
    assert all("things its roles grant (is the shipped RBAC applied here?)" in f.message for f in rbac), shown
    release, original, progressive, ttl, otel = _of(findings, "tensorfusion")
    operator = "Deployment tensor-fusion-sys/tensor-fusion-operator: "
    assert release.severity == "info" and release.message.startswith(
        f"{operator}the original's release 1.40 is older than 2.17.1, the one tfusion implements "
        "(tensor-fusion.ai/v1)"), shown
    assert original.severity == "warning" and original.message.startswith(
        f"{operator}tfusion refuses environment variable TF_ISOLATION_MODE_POLICY='sometimes'"), shown
    assert progressive.severity == "info" and progressive.message.startswith(
        f"{operator}environment variable NVIDIA_OPERATOR_PROGRESSIVE_MIGRATION='true': tfusion takes it, "
        "differently: a pod naming a scheduler other than default-scheduler keeps it"), shown
    config = f"{operator}dynamic config ConfigMap {NS}/tensor-fusion-config config.yaml"
    assert ttl.severity == "info" and ttl.message.startswith(f"{config}, metricsTTL: tfusion takes it"), shown
    assert otel.severity == "warning" and otel.message.startswith(f"{config}, metricsFormat: tfusion takes it"), shown
