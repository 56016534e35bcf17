"""Label/annotation keys, the custom domain, the pod-index encoding and every value parser."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from tfusion.api import annotations as ann
from tfusion.api import podindex
from tfusion.api.annotations import AnnotationError
from tfusion.api.quantity import Quantity


@pytest.fixture(autouse=True)
def _default_domain_afterwards() -> Iterator[None]:
    """set_domain changes module state: put the default back even when a test fails midway."""
    yield
    ann.set_domain(ann.DEFAULT_DOMAIN_PREFIX, ann.DEFAULT_DOMAIN_SUFFIX)


@pytest.fixture
def custom_domain() -> Iterator[None]:
    ann.set_domain("acme-gpu", "example.com")
    try:
        yield
    finally:
        ann.set_domain(ann.DEFAULT_DOMAIN_PREFIX, ann.DEFAULT_DOMAIN_SUFFIX)


# --- keys ----------------------------------------------------------------------------------------------

EXPECTED_KEYS = {
    "GPU_IDS": "tensor-fusion.ai/gpu-ids",
    "GPU_COUNT": "tensor-fusion.ai/gpu-count",
    "GPU_POOL": "tensor-fusion.ai/gpupool",
    "ENABLED": "tensor-fusion.ai/enabled",
    "TFLOPS_REQUEST": "tensor-fusion.ai/tflops-request",
    "VRAM_LIMIT": "tensor-fusion.ai/vram-limit",
    "COMPUTE_PERCENT_LIMIT": "tensor-fusion.ai/compute-percent-limit",
    "QOS": "tensor-fusion.ai/qos",
    "ISOLATION": "tensor-fusion.ai/isolation",
    "INDEX": "tensor-fusion.ai/index",
    "CONTAINER_GPUS": "tensor-fusion.ai/container-gpus",
    "CONTAINER_GPU_COUNT": "tensor-fusion.ai/container-gpu-count",
    "MANAGED_BY": "tensor-fusion.ai/managed-by",
    "LAST_SYNC": "tensor-fusion.ai/last-sync",
    "GPU_MISSING_SINCE": "tensor-fusion.ai/gpu-missing-since",
    "VIRTUALIZATION_CAPABILITIES": "tensor-fusion.ai/virtualization-capabilities",
    "IS_DEFAULT_POOL": "tensor-fusion.ai/is-default-pool",
    "WORKLOAD_MODE": "tensor-fusion.ai/workload-mode",
    "COMPONENT": "tensor-fusion.ai/component",
    "WORKLOAD": "tensor-fusion.ai/workload",
    "FINALIZER": "tensor-fusion.ai/finalizer",
    "EFFECTIVE_HARD_SM_PERCENT": "tensor-fusion.ai/effective-hard-sm-percent",
    "PARTITION_UUIDS": "tensor-fusion.ai/partition-uuids",
    "GANG_GROUP_KEY": "tensor-fusion.ai/gang-group-key",
    "PENDING_OWNED_WORKLOAD": "tensor-fusion.ai/pending-owned-workload",
    "USED_BY": "tensor-fusion.ai/used-by",
    "HOST_PORT": "tensor-fusion.ai/host-port",
    "PORT_NUMBER": "tensor-fusion.ai/port-number",
    "PROVIDER_CONFIG_REVISIONS": "tensor-fusion.ai/provider-config-revisions",
    "HYPERVISOR_UPDATE_IN_PROGRESS": "tensor-fusion.ai/hypervisor-update-in-progress",
    "NODE_PROVISIONER": "tensor-fusion.ai/node-provisioner",
    "HARDWARE_VENDOR": "tensor-fusion.ai/hardware-vendor",
}


def test_default_domain_keys() -> None:
    assert ann.DOMAIN == "tensor-fusion.ai"
    for name, value in EXPECTED_KEYS.items():
        assert getattr(ann, name) == value, name
    assert ann.SCHEDULER_NAME == "tensor-fusion-scheduler"
    assert ann.pool_label("gpu-pool-a") == "tensor-fusion.ai/pool-gpu-pool-a"


def test_every_key_is_a_valid_kubernetes_key() -> None:
    keys = ann.all_keys()
    assert len(keys) >= 85
    assert len(set(keys.values())) == len(keys), "two constants share a key"
    qualified = re.compile(r"[a-z0-9.-]+/([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9_-]?")
    for name, key in keys.items():
        assert qualified.fullmatch(key), (name, key)
        assert len(key.split("/", 1)[1]) <= 63, (name, key)


def test_reference_keys_are_all_present() -> None:
    """Every `tf/<key>` the reference §1-2 and the hypervisor reference name has a constant."""
    named = {key.split("/", 1)[1] for key in ann.all_keys().values()}
    reference = set("""enabled workload-profile gpupool is-local-gpu sidecar-worker isolation partition-id
        worker-pod-template tflops-request tflops-limit vram-request vram-limit compute-percent-request
        compute-percent-limit gpu-count gpu-indices gpu-model vendor qos inject-container dedicated-gpu
        autoscale autoscale-target enabled-replicas gang-enabled gang-min-members gang-timeout
        disable-features host-port port-name eviction-protection require-gpu-topology gpu-topology-max-tier
        gpu-topology-source workload-mode container-gpu-count pending-owned-workload gang-desired-members
        gang-required-members gang-group-key workload selected-workload index pod-template-hash component
        embedded-worker used-by port-number pod-counter-key gpu-ids effective-hard-sm-percent
        container-gpus dedicated-worker defrag-evicted finalizer partition-uuids managed-by cluster
        node-provisioner node-class hardware-vendor node-selector-hash orphan should-delete do-not-disrupt
        expansion-source last-sync gpu-missing-since virtualization-capabilities is-default-pool
        manual-compaction provider-config-revisions provider-config-hash hypervisor-update-in-progress
        worker-update-in-progress client-update-in-progress hypervisor-batch-update-last-time
        worker-batch-update-last-time client-batch-update-last-time hourly-pricing worker-name gpu-vendor
        gpu-instance-family gpu-instance-size""".split())  # noqa: SIM905
    missing = sorted(set(reference) - named)
    assert not missing, missing


def test_set_domain_rewrites_every_key(custom_domain: None) -> None:
    assert ann.DOMAIN == "acme-gpu.example.com"
    assert ann.GPU_IDS == "acme-gpu.example.com/gpu-ids"
    assert ann.FINALIZER == "acme-gpu.example.com/finalizer"
    assert podindex.index_resource(15) == "acme-gpu.example.com/index_f"
    assert ann.pool_label("p") == "acme-gpu.example.com/pool-p"
    assert all(v.startswith("acme-gpu.example.com/") for v in ann.all_keys().values())
    # parsers name the key in the current domain
    with pytest.raises(AnnotationError, match=re.escape("annotation acme-gpu.example.com/gpu-count")):
        ann.parse_gpu_count("0")


def test_set_domain_round_trips_back_to_the_default() -> None:
    before = ann.all_keys()
    ann.set_domain("x", "y")
    try:
        assert ann.QOS == "x.y/qos"
    finally:
        ann.set_domain("tensor-fusion", "ai")
    assert ann.all_keys() == before


@pytest.mark.parametrize(("prefix", "suffix"), [("Tensor", "ai"), ("", "ai"), ("a_b", "ai"), ("tf", "-ai"),
                                                ("tf", "ai/x"), ("x" * 64, "ai"),
                                                ("a." * 125 + "b", "ai")])
def test_set_domain_rejects_what_kubernetes_rejects(prefix: str, suffix: str) -> None:
    with pytest.raises(ValueError, match=r"CUSTOM_DOMAIN_PREFIX/_SUFFIX .* not a DNS subdomain"):
        ann.set_domain(prefix, suffix)
    assert ann.DOMAIN == "tensor-fusion.ai"  # nothing changed


# --- pod index encoding --------------------------------------------------------------------------------


def test_pod_index_encoding_is_a_bijection_without_the_upstream_off_by_one() -> None:
    seen: set[tuple[str, int]] = set()
    for n in range(1, 129):
        resource, count = podindex.encode_pod_index(n)
        assert 1 <= count <= 8
        assert podindex.decode_pod_index(resource, count) == n
        seen.add((resource, count))
    assert len(seen) == 128
    assert podindex.encode_pod_index(1) == ("tensor-fusion.ai/index_0", 1)
    assert podindex.encode_pod_index(8) == ("tensor-fusion.ai/index_0", 8)
    assert podindex.encode_pod_index(9) == ("tensor-fusion.ai/index_1", 1)
    assert podindex.encode_pod_index(128) == ("tensor-fusion.ai/index_f", 8)  # upstream: index_10
    assert {r for r, _ in seen} == set(podindex.index_resource_names())


@pytest.mark.parametrize("n", [0, 129, -1, True])
def test_pod_index_out_of_range(n: int) -> None:
    with pytest.raises(ValueError, match="expected an integer from 1 to 128"):
        podindex.encode_pod_index(n)


def test_decode_pod_index_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="not an index resource"):
        podindex.decode_pod_index("nvidia.com/gpu", 1)
    with pytest.raises(ValueError, match="not an index resource"):
        podindex.decode_pod_index("tensor-fusion.ai/index_10", 1)
    with pytest.raises(ValueError, match="count 9 is out of range"):
        podindex.decode_pod_index("tensor-fusion.ai/index_0", 9)
    with pytest.raises(ValueError, match="count 0 is out of range"):
        podindex.decode_pod_index("tensor-fusion.ai/index_3", 0)
    with pytest.raises(ValueError, match="out of range"):
        podindex.index_resource(16)
    assert podindex.index_resource_number("tensor-fusion.ai/index_a") == 10
    assert podindex.index_resource_number("tensor-fusion.ai/index_A") is None
    assert podindex.index_resource_number("tensor-fusion.ai/index") is None


# --- error shape ---------------------------------------------------------------------------------------


def test_error_message_names_key_value_and_what_is_allowed() -> None:
    with pytest.raises(AnnotationError) as info:
        ann.parse_gpu_count("200")
    err = info.value
    assert str(err) == ('annotation tensor-fusion.ai/gpu-count: "200" is not allowed; '
                        "expected an integer from 1 to 128")
    assert (err.key, err.value) == ("tensor-fusion.ai/gpu-count", "200")
    assert err.allowed == "an integer from 1 to 128"
    assert isinstance(err, ValueError)


def test_error_for_labels_says_label() -> None:
    with pytest.raises(AnnotationError, match=r'^label tensor-fusion.ai/enabled: "maybe" is not allowed'):
        ann.parse_bool("maybe", key=ann.ENABLED, kind="label")


# --- parsers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("True", True), ("TRUE", True), ("1", True),
                                                ("t", True), ("false", False), ("0", False), ("F", False),
                                                (" true ", True)])
def test_parse_bool(text: str, expected: bool) -> None:
    assert ann.parse_bool(text, key=ann.IS_LOCAL_GPU) is expected


@pytest.mark.parametrize("text", ["yes", "", "2", "tru", "on"])
def test_parse_bool_rejects(text: str) -> None:
    with pytest.raises(AnnotationError, match='expected "true" or "false"') as info:
        ann.parse_bool(text, key=ann.IS_LOCAL_GPU)
    assert info.value.key == "tensor-fusion.ai/is-local-gpu"
    assert json.dumps(text) in str(info.value)


@pytest.mark.parametrize(("text", "expected"), [("1", 1), ("128", 128), (" 4 ", 4), ("+2", 2)])
def test_parse_gpu_count(text: str, expected: int) -> None:
    assert ann.parse_gpu_count(text) == expected


@pytest.mark.parametrize("text", ["0", "129", "200", "-1", "1.5", "two", "", "1e2", "٣"])
def test_parse_gpu_count_rejects(text: str) -> None:
    with pytest.raises(AnnotationError, match="expected an integer from 1 to 128"):
        ann.parse_gpu_count(text)


def test_parse_gpu_indices() -> None:
    assert ann.parse_gpu_indices("0,1,3") == (0, 1, 3)
    assert ann.parse_gpu_indices(" 2 , 0 ") == (2, 0)
    assert ann.parse_gpu_indices("7") == (7,)
    for bad, detail in [("0,,1", "'' is not an index"), ("a", "'a' is not an index"), ("-1", "'-1'"),
                        ("1,1", "index 1 appears twice"), ("", "''"), ("1.0", "'1.0'"),
                        ("99999999999", "too large")]:
        with pytest.raises(AnnotationError, match=re.escape(detail)) as info:
            ann.parse_gpu_indices(bad)
        assert info.value.key == ann.GPU_INDICES
        assert "distinct non-negative GPU indices" in str(info.value)


def test_parse_qos_and_isolation() -> None:
    for level in ("low", "medium", "high", "critical"):
        assert ann.parse_qos(level) == level
    for mode in ("shared", "soft", "hard", "partitioned"):
        assert ann.parse_isolation(mode) == mode
    with pytest.raises(AnnotationError, match=r'qos: "urgent" is not allowed; expected one of '
                                              r'low\|medium\|high\|critical'):
        ann.parse_qos("urgent")
    with pytest.raises(AnnotationError, match=r'isolation: "Soft" .*shared\|soft\|hard\|partitioned'):
        ann.parse_isolation("Soft")
    assert ann.priority_class_name("high") == "tensor-fusion-high"
    with pytest.raises(AnnotationError):
        ann.priority_class_name("huge")


def test_parse_choice_helpers() -> None:
    assert ann.parse_workload_mode("fixed") == "fixed"
    assert ann.parse_autoscale_target("vram") == "vram"
    with pytest.raises(AnnotationError, match=r"workload-mode.*dynamic\|fixed"):
        ann.parse_workload_mode("static")
    with pytest.raises(AnnotationError, match=r"compute\|vram\|all"):
        ann.parse_autoscale_target("gpu")


def test_parse_quantity_annotation() -> None:
    q = ann.parse_quantity_annotation("16Gi", key=ann.VRAM_REQUEST)
    assert q == Quantity.parse("16Gi")
    assert str(ann.parse_quantity_annotation("0.5", key=ann.TFLOPS_LIMIT)) == "500m"
    with pytest.raises(AnnotationError) as info:
        ann.parse_quantity_annotation("16GB", key=ann.VRAM_REQUEST)
    assert str(info.value).startswith('annotation tensor-fusion.ai/vram-request: "16GB" is not allowed '
                                      "(unknown suffix 'GB'); expected a non-negative Kubernetes quantity")
    with pytest.raises(AnnotationError, match=r"\(it is negative\)"):
        ann.parse_quantity_annotation("-1", key=ann.TFLOPS_REQUEST)
    with pytest.raises(AnnotationError, match=r"\(it is empty\)"):
        ann.parse_quantity_annotation("", key=ann.TFLOPS_REQUEST)


def test_parse_compute_percent() -> None:
    assert ann.parse_compute_percent("50") == 50
    assert ann.parse_compute_percent("12.5") == Decimal("12.5")
    assert ann.parse_compute_percent("0") == 0
    assert ann.parse_compute_percent("100", key=ann.COMPUTE_PERCENT_LIMIT) == 100
    for bad in ("101", "-1", "abc", "1Ki", "100.001"):
        with pytest.raises(AnnotationError, match="expected a percentage from 0 to 100"):
            ann.parse_compute_percent(bad)


def test_parse_gpu_ids() -> None:
    assert ann.parse_gpu_ids("gpu-1a2b,GPU-3C4D") == ("gpu-1a2b", "gpu-3c4d")
    assert ann.parse_gpu_ids(" gpu-a ") == ("gpu-a",)
    for bad, detail in [("", "'' is not a GPU name"), ("gpu-a,,gpu-b", "''"), ("gpu a", "'gpu a'"),
                        ("gpu-a,GPU-A", "'gpu-a' appears twice"), ("gpu_a", "'gpu_a'")]:
        with pytest.raises(AnnotationError, match=re.escape(detail)) as info:
            ann.parse_gpu_ids(bad)
        assert info.value.key == "tensor-fusion.ai/gpu-ids"
    assert ann.format_gpu_ids(["gpu-a", "gpu-b"]) == "gpu-a,gpu-b"


def test_parse_container_gpus() -> None:
    text = '{"main": ["GPU-1", "gpu-2"], "side": []}'
    assert ann.parse_container_gpus(text) == {"main": ("gpu-1", "gpu-2"), "side": ()}
    formatted = ann.format_container_gpus({"z": ["gpu-2"], "a": ("gpu-1",)})
    assert formatted == '{"a":["gpu-1"],"z":["gpu-2"]}'
    assert ann.parse_container_gpus(formatted) == {"a": ("gpu-1",), "z": ("gpu-2",)}
    for bad, detail in [("not json", "invalid JSON"), ('["gpu-1"]', "not a JSON object"),
                        ('{"main": "gpu-1"}', "container 'main': not a list of names"),
                        ('{"main": [1]}', "container 'main'"), ('{"main": [""]}', "container 'main'")]:
        with pytest.raises(AnnotationError, match=re.escape(detail)) as info:
            ann.parse_container_gpus(bad)
        assert info.value.key == "tensor-fusion.ai/container-gpus"


def test_parse_container_gpu_count() -> None:
    assert ann.parse_container_gpu_count('{"a": 2, "b": 1}') == {"a": 2, "b": 1}
    for bad in ('{"a": 0}', '{"a": 129}', '{"a": true}', '{"a": "2"}', '{"a": 1.5}', "[]"):
        with pytest.raises(AnnotationError, match="container-gpu-count"):
            ann.parse_container_gpu_count(bad)


def test_parse_csv_and_disable_features() -> None:
    assert ann.parse_csv("a, b,,c,a,", key=ann.INJECT_CONTAINER) == ("a", "b", "c")
    assert ann.parse_csv("", key=ann.INJECT_CONTAINER) == ()
    assert ann.parse_disable_features("gpu-limiter,start-worker") == ("gpu-limiter", "start-worker")
    with pytest.raises(AnnotationError, match=r"\('turbo' is unknown\); expected a comma list of gpu-opt, "
                                              "mem-manager, gpu-limiter, start-worker"):
        ann.parse_disable_features("gpu-opt,turbo")


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
                                               ("1.5h", 5400.0), ("500ms", 0.5), ("0", 0.0),
                                               ("2h0m0s", 7200.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert ann.parse_duration(text, key=ann.EVICTION_PROTECTION) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "-5s", "5 s", "5d", "s", "1h-30m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(AnnotationError, match='expected a duration such as "30s"'):
        ann.parse_duration(text, key=ann.EVICTION_PROTECTION)


def test_gang_annotations() -> None:
    assert ann.parse_gang_timeout("0") is None
    assert ann.parse_gang_timeout("0s") is None
    assert ann.parse_gang_timeout("2m") == 120.0
    with pytest.raises(AnnotationError, match="gang-timeout"):
        ann.parse_gang_timeout("soon")
    assert ann.parse_gang_min_members("0") == 0
    assert ann.parse_gang_min_members("3") == 3
    with pytest.raises(AnnotationError,
                       match=r"\(a gang of one is not a gang\); expected 0 \(all replicas\)"):
        ann.parse_gang_min_members("1")
    with pytest.raises(AnnotationError, match="at least 0"):
        ann.parse_gang_min_members("-2")


def test_small_integer_annotations() -> None:
    assert ann.parse_effective_hard_sm_percent("42") == 42
    with pytest.raises(AnnotationError, match="from 1 to 100"):
        ann.parse_effective_hard_sm_percent("0")
    assert ann.parse_port_number("42001") == 42001
    with pytest.raises(AnnotationError, match=r"port-number.*from 1 to 65535"):
        ann.parse_port_number("70000")
    assert ann.parse_pod_index("128") == 128
    with pytest.raises(AnnotationError, match="index: \"129\""):
        ann.parse_pod_index("129")
    assert ann.parse_int("-3", key="k") == -3
    with pytest.raises(AnnotationError, match="expected an integer of at most 5"):
        ann.parse_int("6", key="k", maximum=5)
    with pytest.raises(AnnotationError, match=r"expected an integer$"):
        ann.parse_int("x", key="k")


def test_timestamps() -> None:
    moment = ann.parse_timestamp("2025-01-31T12:00:00Z", key=ann.LAST_SYNC)
    assert moment == datetime(2025, 1, 31, 12, tzinfo=UTC)
    offset = ann.parse_timestamp("2025-01-31T14:00:00+02:00", key=ann.LAST_SYNC)
    assert offset == moment
    assert ann.format_timestamp(offset) == "2025-01-31T12:00:00Z"
    local = datetime(2025, 1, 31, 13, 0, 0, 999, tzinfo=timezone(timedelta(hours=1)))
    assert ann.format_timestamp(local) == "2025-01-31T12:00:00Z"
    with pytest.raises(AnnotationError, match=r"\(no time zone\)"):
        ann.parse_timestamp("2025-01-31T12:00:00", key=ann.GPU_MISSING_SINCE)
    with pytest.raises(AnnotationError, match=r'gpu-missing-since: "yesterday".*RFC 3339'):
        ann.parse_timestamp("yesterday", key=ann.GPU_MISSING_SINCE)


def test_parse_json_object() -> None:
    value = '{"NVIDIA": "abc123"}'
    assert ann.parse_json_object(value, key=ann.PROVIDER_CONFIG_REVISIONS) == {"NVIDIA": "abc123"}
    with pytest.raises(AnnotationError, match="not a JSON object"):
        ann.parse_json_object("[1]", key=ann.VIRTUALIZATION_CAPABILITIES)


# --- shared values and the lenient reader ----------------------------------------------------------------


def test_isolation_modes_are_defined_once_and_match_the_crd_literal() -> None:
    from typing import get_args

    from tfusion.api.kinds.common import IsolationMode

    assert ann.ISOLATION_MODES == (ann.ISOLATION_SHARED, ann.ISOLATION_SOFT, ann.ISOLATION_HARD,
                                   ann.ISOLATION_PARTITIONED) == ("shared", "soft", "hard", "partitioned")
    assert get_args(IsolationMode) == ann.ISOLATION_MODES
    assert ann.DEFAULT_ISOLATION == "soft"
    assert ann.parse_isolation(ann.ISOLATION_HARD) == "hard"


def test_finished_pod_phases_are_kubes_terminal_phases() -> None:
    assert frozenset({"Succeeded", "Failed"}) == ann.FINISHED_POD_PHASES
    assert "Running" not in ann.FINISHED_POD_PHASES and "Pending" not in ann.FINISHED_POD_PHASES


def test_parse_present_reads_good_values_and_reports_bad_ones() -> None:
    errors: list[AnnotationError] = []
    none: tuple[str, ...] = ()
    assert ann.parse_present("gpu-a,gpu-b", ann.parse_gpu_ids, none, on_error=errors.append) == ("gpu-a", "gpu-b")
    assert ann.parse_present(None, ann.parse_gpu_ids, none, on_error=errors.append) == ()
    assert ann.parse_present("", ann.parse_gpu_ids, none, on_error=errors.append) == ()
    assert errors == []
    assert ann.parse_present("gpu a", ann.parse_gpu_ids, none, on_error=errors.append) == ()
    assert [e.key for e in errors] == [ann.GPU_IDS]
    assert "'gpu a' is not a GPU name" in str(errors[0])


def test_parse_present_lets_other_errors_through() -> None:
    def broken(value: str) -> int:
        raise KeyError(value)

    with pytest.raises(KeyError):
        ann.parse_present("x", broken, 0, on_error=lambda exc: None)


def test_durations_and_timestamps_share_the_api_helpers() -> None:
    from tfusion.api import durations, timestamps

    assert ann.parse_duration("1h30m", key=ann.GANG_TIMEOUT) == durations.parse_duration("1h30m")
    assert ann.format_timestamp is timestamps.rfc3339
    assert ann.parse_timestamp("2025-01-31T12:00:00.5Z", key=ann.LAST_SYNC) == timestamps.parse_rfc3339(
        "2025-01-31T12:00:00.5Z")
