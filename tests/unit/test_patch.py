"""Merge, JSON and strategic merge patch over plain JSON values."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tfusion.api.merge import merge_patch_from
from tfusion.apiserver.patch import (
    STRATEGIC_MERGE_KINDS,
    PatchError,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)

# ------------------------------------------------------------------------------------------------
# RFC 7386

null_free = st.recursive(
    st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=20,
)


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [  # the examples of RFC 7386 appendix A
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
    ],
)
def test_merge_patch_rfc_examples(target: Any, patch: Any, expected: Any) -> None:
    assert merge_patch(target, patch) == expected


@given(json_values, json_values)
def test_merge_patch_never_mutates_inputs(target: Any, patch: Any) -> None:
    before_t, before_p = copy.deepcopy(target), copy.deepcopy(patch)
    merge_patch(target, patch)
    assert target == before_t and patch == before_p


@given(st.dictionaries(st.text(max_size=3), json_values, max_size=4))
def test_merge_patch_is_idempotent(patch: dict[str, Any]) -> None:
    once = merge_patch({"x": 1}, patch)
    assert merge_patch(once, patch) == once


# ------------------------------------------------------------------------------------------------
# RFC 6902


@given(st.dictionaries(st.text(max_size=3), null_free, max_size=5),
       st.dictionaries(st.text(max_size=3), null_free, max_size=5))
def test_merge_patch_from_turns_before_into_after(before: dict[str, Any], after: dict[str, Any]) -> None:
    patch = merge_patch_from(before, after)
    assert merge_patch(before, patch) == after
    assert (patch == {}) == (before == after)


def test_merge_patch_from_sends_only_what_changed() -> None:
    before = {"available": {"tflops": "100", "vram": "80Gi"}, "runningApps": [{"name": "a"}], "phase": "Running",
              "allocatedPartitions": {"u1": {"templateId": "1g"}, "u2": {"templateId": "2g"}}}
    after = {"available": {"tflops": "80", "vram": "80Gi"}, "runningApps": [{"name": "a"}, {"name": "b"}],
             "phase": "Running", "allocatedPartitions": {"u2": {"templateId": "2g"}}}
    assert merge_patch_from(before, after) == {
        "available": {"tflops": "80"}, "runningApps": [{"name": "a"}, {"name": "b"}],
        "allocatedPartitions": {"u1": None}}
    assert merge_patch_from(before, {}) == dict.fromkeys(before)


def test_json_patch_add_object_member_and_array_insert_and_append() -> None:
    doc = {"foo": ["bar", "baz"]}
    out = json_patch(
        doc,
        [
            {"op": "add", "path": "/foo/1", "value": "qux"},
            {"op": "add", "path": "/foo/-", "value": "end"},
            {"op": "add", "path": "/new", "value": {"n": None}},
        ],
    )
    assert out == {"foo": ["bar", "qux", "baz", "end"], "new": {"n": None}}
    assert doc == {"foo": ["bar", "baz"]}


def test_json_patch_remove_replace_move_copy_test() -> None:
    doc = {"a": {"b": 1, "c": [1, 2, 3]}, "d": "x"}
    out = json_patch(
        doc,
        [
            {"op": "remove", "path": "/a/c/0"},
            {"op": "replace", "path": "/d", "value": "y"},
            {"op": "move", "from": "/a/b", "path": "/moved"},
            {"op": "copy", "from": "/a/c", "path": "/copied"},
            {"op": "test", "path": "/copied", "value": [2, 3]},
        ],
    )
    assert out == {"a": {"c": [2, 3]}, "d": "y", "moved": 1, "copied": [2, 3]}
    out["copied"].append(9)
    assert out["a"]["c"] == [2, 3], "copy must not alias the source"


def test_json_patch_pointer_escaping() -> None:
    doc = {"a/b": 1, "m~n": 2}
    out = json_patch(
        doc,
        [
            {"op": "replace", "path": "/a~1b", "value": 10},
            {"op": "replace", "path": "/m~0n", "value": 20},
            {"op": "add", "path": "/metadata", "value": {}},
            {"op": "add", "path": "/metadata/tensor-fusion.ai~1gpu", "value": "x"},
        ],
    )
    assert out == {"a/b": 10, "m~n": 20, "metadata": {"tensor-fusion.ai/gpu": "x"}}


def test_json_patch_whole_document() -> None:
    assert json_patch({"a": 1}, [{"op": "replace", "path": "", "value": [1]}]) == [1]
    assert json_patch({"a": 1}, [{"op": "add", "path": "", "value": {"b": 2}}]) == {"b": 2}


def test_json_patch_error_names_op_index_and_path() -> None:
    ops = [
        {"op": "add", "path": "/x", "value": 1},
        {"op": "test", "path": "/x", "value": 1},
        {"op": "replace", "path": "/spec/x", "value": 2},
    ]
    with pytest.raises(PatchError, match=r"^op 2 \(replace /spec/x\): path not found"):
        json_patch({}, ops)


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "remove", "path": "/missing"}], r"op 0 \(remove /missing\): path not found"),
        ([{"op": "add", "path": "/a/b/c", "value": 1}], r"op 0 \(add /a/b/c\): path not found"),
        ([{"op": "add", "path": "/l/5", "value": 1}], r"out of range"),
        ([{"op": "add", "path": "/l/01", "value": 1}], r"not a non-negative integer"),
        ([{"op": "replace", "path": "/l/-", "value": 1}], r"only valid for add"),
        ([{"op": "test", "path": "/l", "value": [1, 3]}], r"test failed"),
        ([{"op": "test", "path": "/t", "value": 1}], r"test failed"),
        ([{"op": "add", "path": "/x"}], r"missing required member 'value'"),
        ([{"op": "move", "path": "/x"}], r"missing required member 'from'"),
        ([{"op": "move", "from": "/o", "path": "/o/inner"}], r"own child"),
        ([{"op": "frob", "path": "/x"}], r"op 0 \(frob /x\): unknown op 'frob'"),
        ([{"path": "/x"}], r"unknown op None"),
        ([{"op": "add", "value": 1}], r"missing required member 'path'"),
        ([{"op": "add", "path": "x", "value": 1}], r"must be empty or start with '/'"),
        ([{"op": "add", "path": "/a~2", "value": 1}], r"invalid escape"),
        ([{"op": "remove", "path": ""}], r"whole document"),
        (["nope"], r"op 0: must be an object"),
    ],
)
def test_json_patch_rejects(ops: list[Any], message: str) -> None:
    doc = {"l": [1, 2], "t": True, "o": {"k": 1}}
    with pytest.raises(PatchError, match=message):
        json_patch(doc, ops)
    assert doc == {"l": [1, 2], "t": True, "o": {"k": 1}}


def test_json_patch_rejects_non_list() -> None:
    with pytest.raises(PatchError, match="must be a list"):
        json_patch({}, {"op": "add"})


def test_json_patch_test_distinguishes_bool_and_number_but_not_int_and_float() -> None:
    json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 1.0}])
    with pytest.raises(PatchError):
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": True}])


def test_json_patch_failed_patch_leaves_target_untouched() -> None:
    doc = {"a": [1]}
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "add", "path": "/a/-", "value": 2}, {"op": "remove", "path": "/zz"}])
    assert doc == {"a": [1]}


def test_json_patch_move_to_same_place_is_noop() -> None:
    assert json_patch({"a": 1}, [{"op": "move", "from": "/a", "path": "/a"}]) == {"a": 1}


# ------------------------------------------------------------------------------------------------
# Strategic merge patch


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "labels": {"app": "x", "tier": "web"},
            "finalizers": ["a", "b"],
            "ownerReferences": [{"uid": "u1", "name": "rs", "kind": "ReplicaSet"}],
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "nginx:1",
                    "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                    "envFrom": [{"configMapRef": {"name": "cm1"}}],
                    "ports": [{"containerPort": 80, "protocol": "TCP"}],
                    "volumeMounts": [{"mountPath": "/data", "name": "data"}],
                }
            ],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "imagePullSecrets": [{"name": "reg"}],
        },
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": False}],
        },
    }


def test_smp_maps_merge_and_null_deletes() -> None:
    original = pod()
    out = strategic_merge_patch(original, {"metadata": {"labels": {"tier": None, "new": "y"}}}, "Pod")
    assert out["metadata"]["labels"] == {"app": "x", "new": "y"}
    assert original == pod(), "input must not be mutated"


def test_smp_containers_merge_by_name_and_new_container_goes_first() -> None:
    out = strategic_merge_patch(
        pod(),
        {"spec": {"containers": [{"name": "main", "image": "nginx:2"}, {"name": "side", "image": "b"}]}},
        "Pod",
    )
    containers = out["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "side"]
    assert containers[0]["image"] == "nginx:2"
    assert containers[0]["env"] == pod()["spec"]["containers"][0]["env"], "untouched fields are kept"
    only_new = strategic_merge_patch(pod(), {"spec": {"containers": [{"name": "side", "image": "b"}]}}, "Pod")
    # kube-apiserver puts patch items not in the live list before the server-only items
    assert [c["name"] for c in only_new["spec"]["containers"]] == ["side", "main"]


def test_smp_env_merges_by_name_ports_by_container_port_mounts_by_path() -> None:
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
                    "ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 443}],
                    "volumeMounts": [{"mountPath": "/data", "readOnly": True}],
                }
            ]
        }
    }
    c = strategic_merge_patch(pod(), patch, "Pod")["spec"]["containers"][0]
    assert {e["name"]: e["value"] for e in c["env"]} == {"A": "1", "B": "two", "C": "3"}
    assert c["ports"][0] == {"containerPort": 80, "protocol": "TCP", "name": "http"}
    assert [p["containerPort"] for p in c["ports"]] == [80, 443]
    assert c["volumeMounts"] == [{"mountPath": "/data", "name": "data", "readOnly": True}]


def test_smp_lists_without_merge_key_are_replaced() -> None:
    patch = {
        "spec": {
            "tolerations": [{"key": "other", "operator": "Exists"}],
            "containers": [{"name": "main", "envFrom": [{"secretRef": {"name": "s"}}]}],
        },
        "status": {"containerStatuses": [{"name": "main", "ready": True}]},
    }
    out = strategic_merge_patch(pod(), patch, "Pod")
    assert out["spec"]["tolerations"] == [{"key": "other", "operator": "Exists"}]
    assert out["spec"]["containers"][0]["envFrom"] == [{"secretRef": {"name": "s"}}]
    assert out["status"]["containerStatuses"] == [{"name": "main", "ready": True}]


def test_smp_status_conditions_merge_by_type() -> None:
    patch = {"status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "reason": "x"}]}}
    conds = strategic_merge_patch(pod(), patch, "Pod")["status"]["conditions"]
    assert {c["type"]: c for c in conds} == {
        "Ready": {"type": "Ready", "status": "True"},
        "PodScheduled": {"type": "PodScheduled", "status": "True", "reason": "x"},
    }


def test_smp_finalizers_are_a_set_and_delete_from_primitive_list() -> None:
    out = strategic_merge_patch(pod(), {"metadata": {"finalizers": ["b", "c"]}}, "Pod")
    assert sorted(out["metadata"]["finalizers"]) == ["a", "b", "c"]
    assert len(out["metadata"]["finalizers"]) == 3
    out = strategic_merge_patch(pod(), {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, "Pod")
    assert out["metadata"]["finalizers"] == ["b"]


def test_smp_owner_references_merge_by_uid() -> None:
    patch = {"metadata": {"ownerReferences": [{"uid": "u1", "controller": True}, {"uid": "u2", "name": "o"}]}}
    refs = strategic_merge_patch(pod(), patch, "Pod")["metadata"]["ownerReferences"]
    assert {r["uid"]: r for r in refs}["u1"] == {
        "uid": "u1",
        "name": "rs",
        "kind": "ReplicaSet",
        "controller": True,
    }
    assert len(refs) == 2


def test_smp_patch_delete_directive_in_list() -> None:
    patch = {"spec": {"containers": [{"name": "main", "env": [{"name": "A", "$patch": "delete"}]}]}}
    env = strategic_merge_patch(pod(), patch, "Pod")["spec"]["containers"][0]["env"]
    assert env == [{"name": "B", "value": "2"}]


def test_smp_delete_then_readd_in_one_patch_keeps_the_new_entry() -> None:
    patch = {
        "spec": {
            "containers": [{"name": "main", "env": [{"name": "A", "$patch": "delete"}, {"name": "A", "value": "new"}]}]
        }
    }
    env = strategic_merge_patch(pod(), patch, "Pod")["spec"]["containers"][0]["env"]
    assert {e["name"]: e.get("value") for e in env} == {"A": "new", "B": "2"}
    assert {"name": "A", "value": "new"} in env


def test_smp_patch_replace_directive_in_list_and_map() -> None:
    patch = {"spec": {"containers": [{"name": "only", "image": "z"}, {"$patch": "replace"}]}}
    out = strategic_merge_patch(pod(), patch, "Pod")
    assert out["spec"]["containers"] == [{"name": "only", "image": "z"}]
    out = strategic_merge_patch(pod(), {"metadata": {"labels": {"$patch": "replace", "only": "1"}}}, "Pod")
    assert out["metadata"]["labels"] == {"only": "1"}


def test_smp_patch_delete_directive_on_map() -> None:
    out = strategic_merge_patch(pod(), {"metadata": {"labels": {"$patch": "delete"}}}, "Pod")
    assert out["metadata"]["labels"] == {}


def test_smp_retain_keys_clears_other_volume_sources() -> None:
    patch = {"spec": {"volumes": [{"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/x"}}]}}
    vols = strategic_merge_patch(pod(), patch, "Pod")["spec"]["volumes"]
    assert vols == [{"name": "data", "hostPath": {"path": "/x"}}]


def test_smp_retain_keys_must_list_patched_fields() -> None:
    patch = {"spec": {"volumes": [{"name": "data", "$retainKeys": ["name"], "hostPath": {"path": "/x"}}]}}
    with pytest.raises(PatchError, match="hostPath"):
        strategic_merge_patch(pod(), patch, "Pod")


def test_smp_set_element_order() -> None:
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "$setElementOrder/env": [{"name": "B"}, {"name": "A"}],
                }
            ]
        }
    }
    env = strategic_merge_patch(pod(), patch, "Pod")["spec"]["containers"][0]["env"]
    assert [e["name"] for e in env] == ["B", "A"]
    assert env[0] == {"name": "B", "value": "2"}


def test_smp_set_element_order_primitives_with_server_only_items() -> None:
    base = {"metadata": {"finalizers": ["x", "a", "b"]}}
    patch = {"metadata": {"$setElementOrder/finalizers": ["b", "a", "c"], "finalizers": ["c"]}}
    out = strategic_merge_patch(base, patch, "ConfigMap")["metadata"]["finalizers"]
    assert out == ["x", "b", "a", "c"]


def test_smp_set_element_order_must_cover_the_patch_list() -> None:
    patch = {"metadata": {"$setElementOrder/finalizers": ["a"], "finalizers": ["z"]}}
    with pytest.raises(PatchError, match="not in \\$setElementOrder"):
        strategic_merge_patch(pod(), patch, "Pod")


def test_smp_set_element_order_must_agree_with_patch_order() -> None:
    patch = {"metadata": {"$setElementOrder/finalizers": ["a", "b"], "finalizers": ["b", "a"]}}
    with pytest.raises(PatchError, match="disagree on the order"):
        strategic_merge_patch(pod(), patch, "Pod")


def test_smp_new_list_field_loses_directives() -> None:
    base = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    patch = {
        "spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}, {"name": "Y", "$patch": "delete"}]}]}
    }
    out = strategic_merge_patch(base, patch, "Pod")
    assert out["spec"]["containers"][0]["env"] == [{"name": "X", "value": "1"}]


def test_smp_node_taints_replace_addresses_and_conditions_merge_by_type() -> None:
    node = {
        "metadata": {"name": "n"},
        "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "Hostname", "address": "n"},
            ],
            "conditions": [{"type": "Ready", "status": "False"}],
        },
    }
    patch = {
        "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.2"}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    out = strategic_merge_patch(node, patch, "Node")
    assert out["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    assert {a["type"]: a["address"] for a in out["status"]["addresses"]} == {
        "InternalIP": "10.0.0.2",
        "Hostname": "n",
    }
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_smp_service_ports_by_port() -> None:
    svc = {"spec": {"ports": [{"port": 80, "targetPort": 8080}]}}
    out = strategic_merge_patch(svc, {"spec": {"ports": [{"port": 80, "name": "http"}, {"port": 443}]}}, "Service")
    assert {p["port"]: p for p in out["spec"]["ports"]}[80] == {
        "port": 80,
        "targetPort": 8080,
        "name": "http",
    }


def test_smp_host_aliases_by_ip_and_image_pull_secrets_by_name() -> None:
    base = {"spec": {"hostAliases": [{"ip": "1.1.1.1", "hostnames": ["a"]}], "imagePullSecrets": [{"name": "r"}]}}
    patch = {"spec": {"hostAliases": [{"ip": "1.1.1.1", "hostnames": ["b"]}], "imagePullSecrets": [{"name": "s"}]}}
    out = strategic_merge_patch(base, patch, "Pod")
    assert out["spec"]["hostAliases"] == [{"ip": "1.1.1.1", "hostnames": ["b"]}]
    assert sorted(s["name"] for s in out["spec"]["imagePullSecrets"]) == ["r", "s"]


def test_smp_unknown_kind_is_refused() -> None:
    with pytest.raises(PatchError, match="not supported for kind 'GPU'"):
        strategic_merge_patch({}, {}, "GPU")
    assert "Pod" in STRATEGIC_MERGE_KINDS and "GPU" not in STRATEGIC_MERGE_KINDS


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ([], "must be a JSON object"),
        ({"metadata": {"$patch": "explode"}}, "unknown \\$patch directive 'explode'"),
        ({"spec": {"containers": [{"image": "no-name"}]}}, "does not contain the merge key 'name'"),
        ({"spec": {"containers": ["str"]}}, "list items must be objects"),
        ({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}, "must be a list"),
        ({"spec": {"$deleteFromPrimitiveList/containers": ["x"]}}, "only to a list of primitives"),
        ({"metadata": {"$setElementOrder/finalizers": "a"}}, "must be a list"),
        ({"spec": {"containers": [{"$patch": "merge"}]}}, "cannot be used inside a list"),
        ({"spec": {"containers": [{"name": "x", "$patch": "zap"}]}}, "unknown \\$patch directive 'zap' in a list"),
    ],
)
def test_smp_rejects(patch: Any, message: str) -> None:
    with pytest.raises(PatchError, match=message):
        strategic_merge_patch(pod(), patch, "Pod")


def test_smp_configmap_data_merges_like_a_map() -> None:
    cm = {"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}}
    out = strategic_merge_patch(cm, {"data": {"a": None, "c": "3"}}, "ConfigMap")
    assert out["data"] == {"b": "2", "c": "3"}


@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), json_values, max_size=3))
def test_smp_without_lists_equals_merge_patch(patch: dict[str, Any]) -> None:
    def has_list_or_directive(v: Any) -> bool:
        if isinstance(v, list):
            return True
        if isinstance(v, dict):
            return any(k.startswith("$") or has_list_or_directive(x) for k, x in v.items())
        return False

    if has_list_or_directive(patch):
        return
    target = {"a": {"x": 1}, "b": 2}
    assert strategic_merge_patch(target, {"data": patch}, "ConfigMap") == merge_patch(target, {"data": patch})


def test_ops_the_caller_owns_go_in_uncopied_and_patch_the_same() -> None:
    """A webhook's patch, decoded for this request alone: its values are inserted as they are (no
    copy), and an op writing into a value an earlier op added gives what the copying path gives."""
    def ops() -> list[dict[str, Any]]:
        return [{"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
                {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B", "value": "2"}},
                {"op": "test", "path": "/spec/containers/0/env/1/name", "value": "B"},
                {"op": "replace", "path": "/spec/containers/0/env/0/value", "value": "3"}]
    pod = {"spec": {"containers": [{"name": "app"}]}}
    owned_ops = ops()
    fast = json_patch(copy.deepcopy(pod), owned_ops, owned=True, ops_owned=True)
    assert fast == json_patch(pod, ops()) == {"spec": {"containers": [{"name": "app", "env": [
        {"name": "A", "value": "3"}, {"name": "B", "value": "2"}]}]}}
    assert fast["spec"]["containers"][0]["env"] is owned_ops[0]["value"]  # not copied
