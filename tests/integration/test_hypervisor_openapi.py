"""The hypervisor's OpenAPI document against the running hypervisor (issue 23): schemathesis with
`--checks all` (response bodies, status codes, content types and headers against the document,
schema-valid input accepted, invalid input refused with a 4xx, Allow on OPTIONS and 405, no 5xx),
in all its phases, with both worker backends. Kubernetes mode runs twice: anonymously (the
troubleshooting listing of `GET /api/v1/pod` with a real worker that has limits), then with a
worker pod's own token, so the limiter's answer is checked against the document too.

The CLI runs as a subprocess (its own event loop) while the hypervisor serves in this test's loop.
What the configuration below allows beyond schemathesis' defaults, and why:

- `POST /api/v1/workers/{id}/snapshot` and `.../resume` answer 501: the original's contract;
- `POST /api/v1/workers` may answer 422 to a schema-valid body: the rules the document cannot
  state (limits not below requests, a gpuCount within this node's devices, gpuIds that are this
  node's, not both gpuCount and gpuIds) are checked by the hypervisor.

The fuzzed document has no `command`, `env` or `workingDir` in the worker body, so no generated
worker runs a program."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers import eventually, no_error_logged_fixture
from tests.helpers.kube_hypervisor import (
    create_pool_and_node,
    kube_hypervisor,
    kube_with_crds,  # noqa: F401  (the `kube` fixture of these tests)
    worker_pod,
)
from tests.helpers.local_hypervisor import hypervisor as local_hypervisor
from tests.helpers.refusals import without_worker_commands
from tfusion.kube.client import KubeClient, NotFound
from tfusion.kube.resources import SERVICEACCOUNTS

#: what a check raises while the hypervisor has not caught up yet
NOT_YET = (AssertionError, NotFound, KeyError)

pytestmark = pytest.mark.anyio

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
#: examples per operation and phase: with ~13 operations this stays well under a minute on a busy machine
MAX_EXAMPLES = 15
CONFIG = """
[[operations]]
include-name = ["POST /api/v1/workers/{worker_id}/snapshot", "POST /api/v1/workers/{worker_id}/resume"]
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "501"]

[[operations]]
include-name = "POST /api/v1/workers"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429"]
"""


no_error_logged = no_error_logged_fixture(autouse=True)

async def run_schemathesis(http: httpx.AsyncClient, workdir: Path, *extra: str) -> tuple[int, str]:
    """Run `schemathesis run --checks all` against the served document; (requests passed, output).
    Fails the test on any failed check, error or warning-free shortfall."""
    document = (await http.get("/schema/openapi.json")).json()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "openapi.json").write_text(json.dumps(without_worker_commands(document)))
    (workdir / "schemathesis.toml").write_text(CONFIG)
    result = await anyio.run_process(
        [str(SCHEMATHESIS), "--config-file", "schemathesis.toml", "--no-color", "run", "openapi.json",
         "--url", str(http.base_url).rstrip("/"), "--checks", "all", "--max-examples", str(MAX_EXAMPLES),
         "--seed", "23", "--generation-database", "none", "--request-timeout", "10", *extra],
        cwd=workdir, check=False)
    output = result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    assert result.returncode == 0, output[-8000:]
    summary = re.search(r"(\d+) generated, (\d+) passed", output)
    assert summary is not None, output[-3000:]
    assert summary.group(1) == summary.group(2), output[-3000:]
    return int(summary.group(2)), output


def allowed(response: httpx.Response) -> set[str]:
    return {method.strip() for method in response.headers["allow"].split(",")}


def documented(document: dict[str, Any]) -> set[str]:
    return {f"{method.upper()} {path}" for path, item in document["paths"].items() for method in item}


async def test_the_local_hypervisor_passes_every_check(tmp_path: Path) -> None:
    async with local_hypervisor(tmp_path / "state") as http:
        document = (await http.get("/schema/openapi.json")).json()
        assert {"POST /api/v1/workers", "DELETE /api/v1/workers/{worker_id}"} <= documented(document)
        # Allow agrees with the document on a path with several methods, for OPTIONS and for a 405
        options = await http.options("/api/v1/workers")
        assert (options.status_code, allowed(options)) == (204, {"GET", "OPTIONS", "POST"})
        refused = await http.put("/api/v1/workers")
        assert (refused.status_code, allowed(refused)) == (405, {"GET", "OPTIONS", "POST"})
        assert allowed(await http.options("/api/v1/workers/x")) == {"DELETE", "GET", "OPTIONS"}
        # a number without a fraction is still one JSON Schema `number`, not two matching branches
        max_tflops = document["components"]["schemas"]["Device"]["properties"]["MaxTflops"]
        assert max_tflops["type"] == "number" and "oneOf" not in max_tflops
        passed, _ = await run_schemathesis(http, tmp_path / "schemathesis")
        assert passed >= 100


async def test_the_kubernetes_hypervisor_passes_every_check(apiserver: ApiServerHandle, kube: KubeClient,
                                                             tmp_path: Path) -> None:
    await create_pool_and_node(kube)
    try:
        await kube.create(SERVICEACCOUNTS, {"metadata": {"name": "default", "namespace": "default"}})
    except Exception:  # the API server may create it itself
        pass
    async with kube_hypervisor(apiserver, tmp_path / "state") as http:
        document = (await http.get("/schema/openapi.json")).json()
        # workers are pods here: no route creates or deletes one, and nothing says otherwise
        assert not {"POST /api/v1/workers", "DELETE /api/v1/workers/{worker_id}"} & documented(document)
        assert allowed(await http.options("/api/v1/workers/x")) == {"GET", "OPTIONS"}
        refused = await http.delete("/api/v1/workers/x")
        assert (refused.status_code, allowed(refused)) == (405, {"GET", "OPTIONS"})
        assert set(refused.json()["allowed"]) == {"GET", "OPTIONS"}

        h100 = (await http.get("/api/v1/devices")).json()["data"][2]["UUID"]
        pod = await worker_pod(kube, "infer-0", [h100])  # limits 200 TFLOPS, 16Gi: 200.0 in /api/v1/pod

        async def listed() -> bool:
            pods = (await http.get("/api/v1/pod")).json()["pods"]
            assert [p["tflops_limit"] for p in pods] == [200.0]
            return True

        await eventually(listed, 10, retry_on=NOT_YET)
        anonymous, _ = await run_schemathesis(http, tmp_path / "anonymous")
        assert anonymous >= 100

        token = await kube.request_token("default", "default",
                                         bound_pod={"name": "infer-0", "uid": pod["metadata"]["uid"]})
        own = await http.get("/api/v1/pod", headers={"Authorization": f"Bearer {token}"})
        assert own.json()["success"] is True and own.json()["data"]["tflops_limit"] == 200.0
        as_the_pod, _ = await run_schemathesis(http, tmp_path / "as-the-pod", "--include-path", "/api/v1/pod",
                                               "--header", f"Authorization: Bearer {token}")
        assert as_the_pod >= 10
