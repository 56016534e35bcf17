"""The embedded bootstrap against the embedded API server over HTTP: CRDs installed, served and
updated only when they change; defaults created once, user edits and deletions kept."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tfusion.api.accessors import Body, items
from tfusion.api.crds import all_crds
from tfusion.embedded.bootstrap import bootstrap
from tfusion.embedded.crd_install import CrdInstallError, install_crds, wait_served
from tfusion.embedded.defaults import DEFAULT_POOL_NAME, PRIORITYCLASSES, RECORD_NAME
from tfusion.kube import resources as r
from tfusion.kube.client import KubeClient, NotFound
from tfusion.settings import Settings

pytestmark = pytest.mark.anyio
HASH = "tensor-fusion.ai/crd-spec-hash"


def settings(**changes: Any) -> Settings:
    return Settings.load({}, env={}, roles=("all",)).replace(**changes)


async def test_crds_are_installed_served_and_left_alone_when_unchanged(kube: KubeClient) -> None:
    first = await install_crds(kube, hash_annotation=HASH)
    assert len(first.created) == 12 and not first.updated
    assert len(await kube.list(r.GPUS)) == 0  # served
    crd = await kube.get(r.CUSTOMRESOURCEDEFINITIONS, "gpus.tensor-fusion.ai")
    rv = crd["metadata"]["resourceVersion"]

    again = await install_crds(kube, hash_annotation=HASH)
    assert len(again.unchanged) == 12 and not again.created and not again.updated
    assert (await kube.get(r.CUSTOMRESOURCEDEFINITIONS, "gpus.tensor-fusion.ai"))["metadata"]["resourceVersion"] == rv


async def test_a_changed_crd_is_replaced_keeping_foreign_labels(kube: KubeClient) -> None:
    await install_crds(kube, hash_annotation=HASH)
    await kube.patch(r.CUSTOMRESOURCEDEFINITIONS, "gpus.tensor-fusion.ai",
                     {"metadata": {"labels": {"team": "gpu"}}})
    newer = all_crds()
    gpu = copy.deepcopy(next(c for c in newer if Body(c).name == "gpus.tensor-fusion.ai"))
    columns = items(gpu, "spec", "versions")[0].setdefault("additionalPrinterColumns", [])
    columns.append({"name": "Extra", "type": "string", "jsonPath": ".status.message"})
    newer = [gpu if Body(c).name == Body(gpu).name else c for c in newer]

    report = await install_crds(kube, hash_annotation=HASH, crds=newer)
    assert report.updated == ["gpus.tensor-fusion.ai"] and len(report.unchanged) == 11
    stored = await kube.get(r.CUSTOMRESOURCEDEFINITIONS, "gpus.tensor-fusion.ai")
    assert stored["metadata"]["labels"]["team"] == "gpu"
    assert any(c["name"] == "Extra" for c in stored["spec"]["versions"][0]["additionalPrinterColumns"])


async def test_wait_served_names_the_kind_that_never_appears(kube: KubeClient) -> None:
    missing = r.ApiResource("nope.example", "v1", "widgets", "Widget", False)
    with pytest.raises(CrdInstallError, match=r"widgets\.nope\.example"):
        await wait_served(kube, [missing], timeout=0.3)


async def test_defaults_are_created_once_and_user_changes_survive(kube: KubeClient) -> None:
    config = settings(operator_namespace="tf-test", controller_listen="127.0.0.1:18080",
                      health_probe_listen="127.0.0.1:0")
    report = (await bootstrap(kube, config)).defaults
    assert "Namespace/tf-test" in report.created
    assert f"GPUPool/{DEFAULT_POOL_NAME}" in report.created
    pool = await kube.get(r.GPUPOOLS, DEFAULT_POOL_NAME)
    assert pool["metadata"]["annotations"]["tensor-fusion.ai/is-default-pool"] == "true"
    assert pool["metadata"]["ownerReferences"][0]["kind"] == "TensorFusionCluster"
    assert pool["spec"]["componentConfig"]["client"]["operatorEndpoint"] == "http://127.0.0.1:18080"
    assert pool["spec"]["schedulingConfigTemplate"] == "tf-scheduling-config"
    await kube.get(r.SCHEDULINGCONFIGTEMPLATES, "tf-scheduling-config")
    values = {name: (await kube.get(PRIORITYCLASSES, f"tensor-fusion-{name}"))["value"]
              for name in ("medium", "high", "critical")}
    assert values == {"medium": 0, "high": 10000, "critical": 100000}
    record = await kube.get(r.CONFIGMAPS, RECORD_NAME, namespace="tf-test")
    assert f"GPUPool/{DEFAULT_POOL_NAME}" in record["data"]["created"]

    await kube.patch(r.GPUPOOLS, DEFAULT_POOL_NAME, {"spec": {"capacityConfig": {
        "oversubscription": {"tflopsOversellRatio": 300}}}})
    await kube.delete(PRIORITYCLASSES, "tensor-fusion-high")
    again = (await bootstrap(kube, config)).defaults
    assert again.created == []
    assert again.left_deleted == ["PriorityClass/tensor-fusion-high"]
    pool = await kube.get(r.GPUPOOLS, DEFAULT_POOL_NAME)
    assert pool["spec"]["capacityConfig"]["oversubscription"]["tflopsOversellRatio"] == 300
    with pytest.raises(NotFound):
        await kube.get(PRIORITYCLASSES, "tensor-fusion-high")


async def test_an_object_the_user_made_first_is_not_touched(kube: KubeClient) -> None:
    await install_crds(kube, hash_annotation=HASH)
    mine = {"apiVersion": "tensor-fusion.ai/v1", "kind": "SchedulingConfigTemplate",
            "metadata": {"name": "tf-scheduling-config"}, "spec": {"placement": {"mode": "CompactFirst"}}}
    await kube.create(r.SCHEDULINGCONFIGTEMPLATES, mine)
    report = (await bootstrap(kube, settings())).defaults
    assert "SchedulingConfigTemplate/tf-scheduling-config" in report.existing
    stored = await kube.get(r.SCHEDULINGCONFIGTEMPLATES, "tf-scheduling-config")
    assert stored["spec"]["placement"]["mode"] == "CompactFirst"
