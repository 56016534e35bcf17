"""`tfusion.api.hashing.content_hash` hashes the same bytes the stdlib json module wrote for the
hashes tfusion stored before it used orjson, so an upgrade leaves every stored hash as it was."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tfusion.api.accessors import GpuPool, Workload
from tfusion.api.hashing import content_hash
from tfusion.controller.reconcilers.nodeselector import selector_hash
from tfusion.controller.reconcilers.workers import template_hash
from tfusion.controller.webhook.mutate import pool_template_hash


def old_hash(value: Any, length: int) -> str:
    """What tfusion computed with json.dumps."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


#: what Kubernetes objects hold: any text (control characters, DEL, accents, emoji), 64-bit integers,
#: booleans, null, floats written in plain notation, lists and objects of them
_values = st.recursive(
    st.none() | st.booleans() | st.text() | st.integers(-2**63, 2**64 - 1)
    | st.floats(min_value=1e-4, max_value=1e15, allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(_values)
def test_the_hash_is_the_one_json_dumps_gave(value: Any) -> None:
    assert content_hash(value, 16) == old_hash(value, 16)


def test_the_hashes_tfusion_stores_are_unchanged() -> None:
    client = {"resources": {"limits": {"cpu": "1"}}, "env": [{"name": "GREETING", "value": "grüß dich 😀\x7f"}]}
    components = {"client": client, "worker": client, "hypervisor": {"portNumber": 8000}}
    pool: dict[str, Any] = {"spec": {"componentConfig": components,
                     "nodeManagerConfig": {"nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "zone", "operator": "In", "values": ["zürich"]}]}]}}}}
    workload: dict[str, Any] = {"spec": {"replicas": 3, "gpuCount": 1, "qos": "high", "ratio": 0.75}}
    assert pool_template_hash(GpuPool(pool)) == old_hash(client, 10)
    assert template_hash(GpuPool(pool), Workload(workload)) == old_hash(
        {"worker": client, "hypervisorPort": 8000, "spec": {"gpuCount": 1, "qos": "high", "ratio": 0.75}}, 10)
    config = pool["spec"]["nodeManagerConfig"]
    selectors = [config.get("nodeSelector"), config.get("multiVendorNodeSelector")]
    assert selector_hash(GpuPool(pool)) == old_hash(selectors, 16)
