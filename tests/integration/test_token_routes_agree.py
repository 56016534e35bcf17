"""Every token route refuses the same bad credentials with the same status and words.

The four routes that take a service-account token (`GET /api/connection` and
`GET /api/assign-index` on the controller, `GET /api/v1/pod` and `POST /api/v1/process` on the
hypervisor) all go through `tfusion.kube.auth.authenticate`. A real controller and a real
Kubernetes-mode hypervisor against one embedded API server get the same headers: none, a bare
`Bearer`, another scheme, a raw malformed token, a forged token, a genuine token of an unrelated
ServiceAccount, and, with the API server stopped, a token nobody has reviewed yet."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.controller import controllers, start_controller
from tests.helpers.kube_hypervisor import (
    kube_hypervisor,
    kube_with_crds,  # noqa: F401  (the `kube` fixture of these tests)
)
from tests.helpers.webhook import webhook_settings
from tfusion.kube import resources as r
from tfusion.kube.auth import AUTH_FORMS
from tfusion.kube.client import KubeClient, KubeError

pytestmark = pytest.mark.anyio

UNRELATED = "system:serviceaccount:default:stranger"
#: (server, method, path, query) of each token route
ROUTES = (("controller", "GET", "/api/connection", {"name": "c", "namespace": "default"}),
          ("controller", "GET", "/api/assign-index", {"podName": "default/p"}),
          ("hypervisor", "GET", "/api/v1/pod", {"container_name": "main"}),
          ("hypervisor", "POST", "/api/v1/process", {"container_name": "main", "container_pid": "1"}))


def message_of(answer: httpx.Response) -> str:
    """The refusal's words: the assign routes answer text/plain, the others `{"error", "field"}`."""
    if answer.headers["content-type"].startswith("text/plain"):
        return answer.text
    body = answer.json()
    assert body["field"] == "Authorization", body
    return str(body["error"])


@asynccontextmanager
async def stacks(apiserver: Any, tmp_path: Path) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """A controller (webhook, assignments, connection route) and a Kubernetes-mode hypervisor."""
    (tmp_path / "controller").mkdir()
    (tmp_path / "hypervisor").mkdir()
    async with controllers() as tg:
        ctl = await start_controller(tg, webhook_settings(apiserver, tmp_path / "controller"))
        async with kube_hypervisor(apiserver, tmp_path / "hypervisor") as hypervisor:
            yield {"controller": ctl.http, "hypervisor": hypervisor}


async def answers(servers: dict[str, httpx.AsyncClient], header: str | None) -> list[tuple[str, int, str]]:
    headers = {} if header is None else {"Authorization": header}
    found = []
    for server, method, path, query in ROUTES:
        answer = await servers[server].request(method, path, params=query, headers=headers)
        found.append((path, answer.status_code, message_of(answer)))
    return found


def assert_one_answer(found: list[tuple[str, int, str]], status: int, start: str) -> None:
    assert {(code, message) for _, code, message in found} == {(status, found[0][2])}, found
    assert found[0][2].startswith(start), found


async def test_token_routes_refuse_alike(apiserver: Any, kube: KubeClient, tmp_path: Path) -> None:
    await kube.create(r.SERVICEACCOUNTS, {"metadata": {"name": "stranger", "namespace": "default"}},
                      namespace="default")
    unrelated = await kube.request_token("default", "stranger")
    head, payload, _ = unrelated.split(".")
    forged = f"{head}.{payload}.c2lnbmF0dXJl"  # the same claims, another signature
    async with stacks(apiserver, tmp_path) as servers:
        assert_one_answer(await answers(servers, None), 401, "unauthorized: no Authorization header")
        for header in ("Bearer", "Basic abc", f"Basic {unrelated}"):
            assert_one_answer(await answers(servers, header), 401,
                              f"unauthorized: the Authorization header must be {AUTH_FORMS}")
        for header in ("not-a-jwt", f"Bearer {forged}", forged):
            found = await answers(servers, header)
            assert_one_answer(found, 401, "unauthorized: ")
            assert "Authorization header" not in found[0][2], "the API server's reason, not the header's form"

        # a genuine token, of a ServiceAccount none of these routes serves: each says why it is not
        # the one it wants (a pod's, or the controller's own), after the same words
        for header in (f"Bearer {unrelated}", unrelated):
            found = await answers(servers, header)
            assert {code for _, code, _ in found} == {401}, found
            assert all(message.startswith(f"unauthorized: the token of {UNRELATED} is not ")
                       for _, _, message in found), found
            pod_routes = {message for path, _, message in found if path != "/api/assign-index"}
            assert pod_routes == {f"unauthorized: the token of {UNRELATED} is not bound to a pod; use the calling "
                                  "pod's ServiceAccount token"}, found

        apiserver.stop()
        with pytest.raises((KubeError, httpx.HTTPError)):
            await kube.get(r.SERVICEACCOUNTS, "stranger", namespace="default")
        assert_one_answer(await answers(servers, "Bearer never-reviewed"), 503, "token review failed, retry later: ")
