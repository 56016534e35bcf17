"""The hypervisor's scheduling document: TF_HYPERVISOR_SCHEDULING_CONFIG wins key by key over the
pool's SchedulingConfigTemplate `spec.hypervisor`."""

from __future__ import annotations

import json

import pytest

from tfusion.hypervisor.http import auto_freeze_rule
from tfusion.hypervisor.limiter.config import SchedulingConfig, merged, parse_document


def test_env_wins_key_by_key_over_the_template() -> None:
    config = SchedulingConfig(json.dumps({"elasticRateLimitParameters": {"kp": "2"}}))
    config.template = {"elasticRateLimitParameters": {"kp": "1", "capacityMin": "300"},
                       "autoFreezeAndResume": {"autoFreeze": [{"qos": "low", "enable": True}]}}
    params = config.erl_params()
    assert (params.kp, params.cap_min) == (2.0, 300.0)
    assert auto_freeze_rule(json.dumps(config.document()), "low") == {"enable": True}
    assert SchedulingConfig("").erl_params().kp == 0.9


def test_merge_and_parse() -> None:
    assert merged({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": 3}, "d": {"x": 1}}) == {"a": {"b": 1, "c": 3},
                                                                                       "d": {"x": 1}}
    assert parse_document("  ") == {}
    with pytest.raises(ValueError, match="must be a JSON object"):
        parse_document("[1]")
