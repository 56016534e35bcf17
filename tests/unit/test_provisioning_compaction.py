"""A pool's compaction and defrag settings as the compaction loop reads them
(tfusion/controller/provisioning/compaction.py: pool_settings, pool_capacity), without a server."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tfusion.api.accessors import GpuPool
from tfusion.controller.provisioning.compaction import DEFAULT_PERIOD_S, ConfigError, pool_capacity, pool_settings
from tfusion.controller.provisioning.compaction_plan import NodeFacts
from tfusion.controller.provisioning.plan import Capacity, PoolCapacity, Targets

GI = 1 << 30


def pool(node_manager: dict[str, Any] | None = None, **spec: Any) -> GpuPool:
    return GpuPool({"apiVersion": "tensor-fusion.ai/v1", "kind": "GPUPool", "metadata": {"name": "p"},
                    "spec": {"nodeManagerConfig": node_manager or {}, **spec}})


def test_without_node_compaction_the_period_is_a_minute_and_there_is_no_defrag() -> None:
    found = pool_settings(pool())
    assert (found.period_s, found.defrag, found.targets) == (DEFAULT_PERIOD_S, None, Targets(None, None, None))
    assert DEFAULT_PERIOD_S == 60.0


def test_node_compaction_without_a_period_takes_the_crds_five_minutes() -> None:
    assert pool_settings(pool({"nodeCompaction": {}})).period_s == 300.0
    assert pool_settings(pool({"nodeCompaction": {"period": "30m"}})).period_s == 1800.0


def test_targets_come_from_the_capacity_config() -> None:
    found = pool_settings(pool(capacityConfig={"minResources": {"tflops": "20", "vram": "10Gi"},
                                               "warmResources": {"tflops": "10"}}))
    assert found.targets.minimum == Capacity(20_000, 10 * GI)
    assert found.targets.warm == Capacity(10_000, 0)


def test_defrag_settings_are_read_only_when_enabled() -> None:
    off = {"nodeCompaction": {"defrag": {"timezone": "UTC"}}}
    assert pool_settings(pool(off)).defrag is None
    on = {"nodeCompaction": {"defrag": {"enabled": True, "timezone": "Asia/Shanghai", "schedule": "30 2 * * 1",
                                        "maxDuration": "1h", "utilizationThresholdPercent": 25}}}
    defrag = pool_settings(pool(on)).defrag
    assert defrag is not None
    assert (defrag.max_duration_s, defrag.threshold_percent, defrag.text) == (3600.0, 25, ("30 2 * * 1",
                                                                                          "Asia/Shanghai"))
    monday_0230_shanghai = datetime(2026, 1, 5, 2, 30, tzinfo=ZoneInfo("Asia/Shanghai")).timestamp()
    assert defrag.schedule.next_after(monday_0230_shanghai - 3600, defrag.zone) == monday_0230_shanghai


@pytest.mark.parametrize(("compaction", "message"), [
    ({"period": "soon"}, "spec.nodeManagerConfig.nodeCompaction.period: expected a duration such as 30s, 5m or "
                         "1h30m, got 'soon'"),
    ({"period": "0s"}, "spec.nodeManagerConfig.nodeCompaction.period: '0s' is not allowed; expected a positive "
                       "duration"),
    ({"defrag": {"enabled": True, "timezone": "Mars/Olympus"}},
     "spec.nodeManagerConfig.nodeCompaction.defrag.timezone: 'Mars/Olympus' is not allowed: unknown time zone "
     "Mars/Olympus"),
    ({"defrag": {"enabled": True, "timezone": "UTC", "schedule": "0 3 * *"}},
     "spec.nodeManagerConfig.nodeCompaction.defrag.schedule: '0 3 * *' is not allowed: expected exactly 5 "
     "fields, found 4: '0 3 * *'"),
    ({"defrag": {"enabled": True, "timezone": "UTC", "maxDuration": "a while"}},
     "spec.nodeManagerConfig.nodeCompaction.defrag.maxDuration: expected a duration such as 30s, 5m or 1h30m, "
     "got 'a while'"),
])
def test_bad_settings_name_the_field_and_the_value(compaction: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        pool_settings(pool({"nodeCompaction": compaction}))
    assert str(caught.value) == message


def test_the_pool_capacity_counts_running_nodes_only() -> None:
    def node(name: str, running: bool, tflops: int, free: int) -> NodeFacts:
        return NodeFacts(name, "p", "", 0.0, running, free == tflops, False, Capacity(tflops, 0),
                         Capacity(free, 0), 0.0)

    assert pool_capacity([node("a", True, 100, 40), node("b", False, 100, 100), node("c", True, 50, 50)]) == \
        PoolCapacity(Capacity(150, 0), Capacity(90, 0), Capacity(0, 0))
