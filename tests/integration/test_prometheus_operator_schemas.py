"""The ServiceMonitor, PodMonitor and PrometheusRule that deploy/overlays/prometheus-operator ships are
valid for the Prometheus Operator: its own CRDs (tests/fixtures/prometheus-operator) are installed in
the embedded API server, and the rendered objects are created there (dry run) with strict field
validation, as `kubectl apply --validate=strict` would against a cluster running the operator. A
misspelt field and a wrongly typed one are refused, so the check is not one that always passes."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.deploy import REPO, Doc, render_own
from tests.helpers.kubectl import needs_kubectl

pytestmark = needs_kubectl

CRDS = REPO / "tests" / "fixtures" / "prometheus-operator"
NAMESPACE = "tensor-fusion-sys"
PLURAL = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}


def _install_crds(http: httpx.Client) -> None:
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        answer = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
        assert answer.status_code == 201, answer.text
        name = crd["metadata"]["name"]
        deadline = time.monotonic() + 30
        while not _established(http.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}").json()):
            assert time.monotonic() < deadline, f"CRD {name} never became Established"
            time.sleep(0.05)


def _established(crd: Doc) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in crd.get("status", {}).get("conditions", []))


def _create(http: httpx.Client, obj: Doc) -> httpx.Response:
    namespace = obj["metadata"].get("namespace", NAMESPACE)
    path = f"/apis/monitoring.coreos.com/v1/namespaces/{namespace}/{PLURAL[obj['kind']]}"
    return http.post(path, params={"dryRun": "All", "fieldValidation": "Strict"}, json=obj)


@pytest.fixture
def operator_api(apiserver: ApiServerHandle) -> Any:
    with apiserver.sync_http() as http:
        _install_crds(http)
        # the embedded server makes tfusion's own namespace itself; on another it would be created here
        assert http.get(f"/api/v1/namespaces/{NAMESPACE}").status_code == 200
        yield http


def _monitoring_objects(tmp_path: Path) -> list[Doc]:
    docs = render_own(tmp_path / "mine", overlay="builtin-scheduler", components=("prometheus-operator",))
    objects = [d for (kind, _), d in sorted(docs.items()) if kind in PLURAL]
    assert sorted(d["kind"] for d in objects) == sorted(PLURAL)
    return objects


def test_the_shipped_monitoring_objects_are_valid_for_the_operator(operator_api: httpx.Client, tmp_path: Path) -> None:
    for obj in _monitoring_objects(tmp_path):
        answer = _create(operator_api, obj)
        assert answer.status_code == 201, f"{obj['kind']} {obj['metadata']['name']}: {answer.text}"
        assert not answer.headers.get("warning"), answer.headers.get("warning")


def test_a_misspelt_or_mistyped_field_is_refused(operator_api: httpx.Client, tmp_path: Path) -> None:
    monitor = next(d for d in _monitoring_objects(tmp_path) if d["kind"] == "ServiceMonitor")
    misspelt = copy.deepcopy(monitor)
    misspelt["spec"]["endpoints"][0]["intervall"] = "30s"
    answer = _create(operator_api, misspelt)
    assert answer.status_code in (400, 422), answer.text
    assert "intervall" in answer.text
    mistyped = copy.deepcopy(monitor)
    mistyped["spec"]["endpoints"][0]["honorLabels"] = "yes"
    answer = _create(operator_api, mistyped)
    assert answer.status_code == 422, answer.text
    assert "honorLabels" in answer.text
