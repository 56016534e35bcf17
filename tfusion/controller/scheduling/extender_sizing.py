"""How large a kube-scheduler extender request may be, and the node it is derived from.

Why a module: without `nodeCacheCapable`, kube-scheduler sends every candidate Node object in each
filter and prioritize call, so the extender routes must take bodies far larger than any other
route, but not unboundedly large (an unauthenticated caller could otherwise make the controller
buffer and parse gigabytes). The limit is derived from a realistic GPU node rather than guessed;
`sample_node` is that node, so the derivation can be re-measured (`extender_args_bytes`), the
tests check that the limit still covers a 5,000-node cluster, and the hostile-edge benchmark sends
limit-sized bodies built from it.

The figure (`EXTENDER_MAX_BODY_BYTES` in http.py): `sample_node` (a GPU node as a managed cluster
shows it: 31 labels, 6 annotations, 5 conditions with kubelet's messages, 10 cached images with tag
and digest names, GPU capacity, addresses, nodeInfo, a taint; no managedFields) is 5,914 bytes of
compact JSON; 5,000 of them in a NodeList are 28.2 MiB; the Pod beside them may be as large as
kube stores an object (1.5 MiB): 29.7 MiB, rounded up to 32 MiB. The shipped scheduler config
sets `nodeCacheCapable: true` (node names only, a few KiB); this limit is for the other mode.
"""

from __future__ import annotations

import orjson

from tfusion.api.jsontypes import JsonObject, JsonValue

#: the cluster size the limit is sized for (kube's documented scalability limit is 5,000 nodes)
SIZED_FOR_NODES = 5000
#: the largest Pod the ExtenderArgs may carry beside the nodes: kube stores objects up to 1.5 MiB
POD_ALLOWANCE_BYTES = 1536 * 1024


def sample_node(name: str) -> JsonObject:
    """A GPU Node object as kube-scheduler's informer holds it in a managed cluster."""
    zone = "us-central1-a"
    labels: JsonObject = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "a2-ultragpu-8g",
        "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux", "node.kubernetes.io/instance-type": "a2-ultragpu-8g",
        "topology.kubernetes.io/region": "us-central1", "topology.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": "us-central1", "failure-domain.beta.kubernetes.io/zone": zone,
        "cloud.google.com/gke-nodepool": "gpu-pool-a100", "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/machine-family": "a2", "cloud.google.com/gke-accelerator": "nvidia-a100-80gb",
        "cloud.google.com/gke-gpu-driver-version": "latest", "cloud.google.com/gke-boot-disk": "pd-balanced",
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/mig.capable": "true", "nvidia.com/gfd.timestamp": "1733011200",
        "feature.node.kubernetes.io/pci-10de.present": "true", "tensor-fusion.ai/managed": "true",
        "tensor-fusion.ai/pool": "default-pool",
    }
    annotations: JsonObject = {
        "node.alpha.kubernetes.io/ttl": "0",
        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": f'{{"pd.csi.storage.gke.io":"projects/example-project/zones/{zone}/'
                                           f'instances/{name}"}}',
        "container.googleapis.com/instance_id": "4871930172634512896",
        "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
        "tensor-fusion.ai/last-sync": "2026-12-01T20:00:00Z",
    }
    now = "2026-12-01T20:00:00Z"

    def condition(kind: str, status: str, reason: str, message: str) -> JsonObject:
        return {"type": kind, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": now,
                "reason": reason, "message": message}

    def image(repository: str, tag: str, size: int, digest_seed: int) -> JsonObject:
        digest = f"{digest_seed:064x}"
        return {"names": [f"{repository}@sha256:{digest}", f"{repository}:{tag}"], "sizeBytes": size}

    resources: JsonObject = {"cpu": "96", "memory": "1386703436Ki", "pods": "110",
                             "ephemeral-storage": "253869360Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                             "nvidia.com/gpu": "8"}
    return {
        "metadata": {
            "name": name, "uid": "9f1c2d3e-4b5a-6978-8a9b-0c1d2e3f4a5b", "resourceVersion": "184467440",
            "creationTimestamp": "2026-11-02T08:15:42Z", "labels": labels, "annotations": annotations,
        },
        "spec": {
            "podCIDR": "10.52.14.0/24", "podCIDRs": ["10.52.14.0/24"],
            "providerID": f"gce://example-project/{zone}/{name}",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": resources, "allocatable": {**resources, "cpu": "95690m", "memory": "1372823628Ki"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status. AppArmor enabled"),
                condition("NetworkUnavailable", "False", "RouteCreated", "NodeController create implicit route"),
            ],
            "addresses": [{"type": "InternalIP", "address": "10.128.0.57"},
                          {"type": "ExternalIP", "address": "34.66.201.18"},
                          {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "4c2a9e7d1b3f4e8a9c0d2e4f6a8b0c1d", "systemUUID": "4c2a9e7d-1b3f-4e8a-9c0d-2e4f6a8b0c1d",
                "bootID": "e1d2c3b4-a5f6-4789-8abc-def012345678", "kernelVersion": "6.1.100+",
                "osImage": "Container-Optimized OS from Google", "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.31.1-gke.1678000", "kubeProxyVersion": "v1.31.1-gke.1678000",
                "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": [
                image("nvcr.io/nvidia/pytorch", "24.10-py3", 9871234567, 1),
                image("nvcr.io/nvidia/tritonserver", "24.10-py3", 7812345678, 2),
                image("nvcr.io/nvidia/k8s-device-plugin", "v0.16.2", 123456789, 3),
                image("nvcr.io/nvidia/gpu-feature-discovery", "v0.8.2", 98765432, 4),
                image("nvcr.io/nvidia/k8s/dcgm-exporter", "3.3.8-3.6.0-ubuntu22.04", 412345678, 5),
                image("docker.io/tensorfusion/tensor-fusion-hypervisor", "1.40.0", 234567890, 6),
                image("gke.gcr.io/gke-metrics-agent", "1.14.3-gke.0", 87654321, 7),
                image("gke.gcr.io/kube-proxy-amd64", "v1.31.1-gke.1678000", 76543210, 8),
                image("gke.gcr.io/fluent-bit", "v1.8.12-gke.46", 65432109, 9),
                image("registry.k8s.io/pause", "3.10", 321098, 10),
            ],
        },
    }


def sample_worker_pod(name: str = "worker") -> JsonObject:
    """A TensorFusion worker pod with a generous spec (the Pod half of an ExtenderArgs)."""
    env: list[JsonValue] = [{"name": f"SETTING_{i:03d}", "value": "x" * 40} for i in range(100)]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": "0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e",
                     "labels": {"tensor-fusion.ai/component": "worker"},
                     "annotations": {"tensor-fusion.ai/gpupool": "default-pool",
                                     "tensor-fusion.ai/tflops-request": "10", "tensor-fusion.ai/vram-request": "4Gi"}},
        "spec": {"schedulerName": "default-scheduler",
                 "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.10-py3", "env": env}]},
    }


def extender_args_bytes(nodes: int = SIZED_FOR_NODES) -> int:
    """The compact JSON size of an ExtenderArgs carrying `nodes` sample nodes (nodeCacheCapable false)."""
    item = len(orjson.dumps(sample_node("gpu-node-00000")))
    envelope = len(orjson.dumps({"Pod": sample_worker_pod(), "Nodes": {"apiVersion": "v1", "kind": "NodeList",
                                                                       "metadata": {}, "items": []},
                                 "NodeNames": None}))
    return envelope + nodes * (item + 1)
