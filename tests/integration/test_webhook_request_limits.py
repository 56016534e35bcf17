"""Through the embedded API server and the TLS webhook: a pod whose request exceeds its limit is
refused with 400 naming both annotations and values (as kube refuses `requests > limits`); a pod
whose request equals its limit is admitted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.controller import controllers
from tests.helpers.webhook import (
    kube_with_webhook_objects,  # noqa: F401  (the `kube` fixture of these tests)
    pod,
    serve_webhook,
    webhook_settings,
)
from tfusion.api import annotations as tfa
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, KubeError

pytestmark = pytest.mark.anyio


async def test_a_request_above_its_limit_is_refused_and_an_equal_one_admitted(apiserver: Any, kube: KubeClient,
                                                                              tmp_path: Path) -> None:
    async with controllers() as tg:
        await serve_webhook(tg, kube, webhook_settings(apiserver, tmp_path))
        over = {tfa.TFLOPS_REQUEST: "5000", tfa.TFLOPS_LIMIT: "40", tfa.VRAM_REQUEST: "8Gi"}
        with pytest.raises(KubeError) as info:
            await kube.create(r.PODS, pod("over", over), namespace="default")
        assert info.value.code == 400
        assert info.value.message == (
            'admission webhook "pod.tensor-fusion.ai" denied the request: tensor-fusion.ai/tflops-request '
            '"5000" is greater than tensor-fusion.ai/tflops-limit "40"; a request may not exceed its limit')
        assert "over" not in [p["metadata"]["name"] for p in await kube.list(r.PODS, namespace="default")]
        equal = {tfa.TFLOPS_REQUEST: "40", tfa.TFLOPS_LIMIT: "40", tfa.VRAM_REQUEST: "8Gi", tfa.VRAM_LIMIT: "8Gi"}
        created = await kube.create(r.PODS, pod("equal", equal), namespace="default")
        notes = created["metadata"]["annotations"]
        assert (notes[tfa.TFLOPS_REQUEST], notes[tfa.TFLOPS_LIMIT], notes[tfa.QOS]) == ("40", "40", "high")
