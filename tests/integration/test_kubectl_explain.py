"""The real kubectl explains the tensor-fusion.ai/v1 kinds from the embedded API server's OpenAPI.

`kubectl explain` reads /openapi/v3 (built from the stored CRDs), so this checks the whole path:
attribute docstrings in the models -> generated CRD -> API server -> what a user reads.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tfusion.api import crds

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path(KUBECTL).exists(), reason="kubectl is not installed")


class Kubectl:
    def __init__(self, kubeconfig: str, cache: Path) -> None:
        self.base = [KUBECTL, "--kubeconfig", kubeconfig, "--cache-dir", str(cache)]

    def __call__(self, *args: str) -> str:
        result = subprocess.run([*self.base, *args], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
        return result.stdout


@pytest.fixture
def kubectl(apiserver: Any, tmp_path: Path) -> Kubectl:
    client = Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")
    client("apply", "-f", str(REPO / "deploy" / "base" / "crds"))
    return client


def object_paths(schema: dict[str, Any], path: str) -> list[str]:
    """`path` and every object-valued field below it (list items included), as kubectl spells them."""
    found = [path] if schema.get("properties") else []
    item = schema.get("items") if schema.get("type") == "array" else schema
    for name, sub in (item or {}).get("properties", {}).items():
        found += object_paths(sub, f"{path}.{name}")
    return found


def test_capacity_config_fields_are_described(kubectl: Kubectl) -> None:
    out = kubectl("explain", "gpupool.spec.capacityConfig")
    assert "<empty>" not in out
    assert "FIELD: capacityConfig <Object>" in out
    assert "Capacity bounds, warm capacity and oversubscription." in out
    for field in ("maxResources", "minResources", "oversubscription", "warmResources"):
        assert f"  {field}\t<Object>" in out
    out = kubectl("explain", "gpupool.spec.capacityConfig.oversubscription.tflopsOversellRatio")
    assert "Default 500" in out and "<empty>" not in out


def test_workload_spec_recursive_and_every_object_below_it(kubectl: Kubectl) -> None:
    out = kubectl("explain", "tensorfusionworkload.spec", "--recursive")
    assert "<empty>" not in out
    assert "The GPU request; written by a user or by the webhook" in out
    for field in ("gangScheduling", "minMembers", "resources", "requests", "tflops", "vram", "nodeAffinity"):
        assert f"{field}\t<" in out, f"{field} missing from the recursive listing"
    schema: Any = crds.openapi_schema_view("TensorFusionWorkload")
    spec = schema["properties"]["spec"]
    for path in object_paths(spec, "tensorfusionworkload.spec"):
        out = kubectl("explain", path)
        assert "<empty>" not in out, f"kubectl explain {path} shows a field without description:\n{out}"
    tflops = kubectl("explain", "tensorfusionworkload.spec.resources.requests.tflops")
    assert "Kubernetes quantity such as 20 or 1500m" in tflops
