"""Events through both APIs: `core/v1` and `events.k8s.io/v1` are one store in two shapes, so an
event written through either is listed, read, watched and patched through the other, with the newer
API's field names (note, regarding, reportingController, deprecated*). The newer API selects on its
own field names and refuses incomplete writes as kube does; kubectl and the official client use both."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client as kube_client

from tests.apiserver_fixture import ApiServerHandle
from tests.helpers.kubectl import Kubectl, needs_kubectl
from tests.helpers.official_client import official_client

CORE = "/api/v1/namespaces/default/events"
NEW = "/apis/events.k8s.io/v1/namespaces/default/events"
MERGE = {"content-type": "application/merge-patch+json"}


@pytest.fixture
def http(apiserver: Any) -> Any:
    with apiserver.sync_http(timeout=30) as client:
        yield client


def core_event(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "default"},
            "reason": "Scheduled", "message": "bound to node-a", "type": "Normal", "count": 3,
            "source": {"component": "tfusion-scheduler"}, "reportingComponent": "tfusion/scheduler",
            "reportingInstance": "box", "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:05:00Z"}


def new_event(name: str) -> dict[str, Any]:
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name},
            "eventTime": "2026-01-01T00:00:00.000000Z", "reportingController": "tfusion/controller",
            "reportingInstance": "box", "action": "Allocate", "reason": "Allocated", "type": "Normal",
            "regarding": {"kind": "Pod", "name": "web-1", "namespace": "default"}, "note": "one vGPU",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}}


def created(http: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = http.post(path, json=body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def test_a_core_event_reads_in_the_new_shape(http: httpx.Client) -> None:
    created(http, CORE, core_event("scheduled"))
    got = http.get(f"{NEW}/scheduled").json()
    assert got["apiVersion"] == "events.k8s.io/v1" and got["kind"] == "Event"
    assert got["regarding"]["name"] == "web-0" and got["note"] == "bound to node-a"
    assert got["reportingController"] == "tfusion/scheduler" and got["reportingInstance"] == "box"
    assert got["deprecatedCount"] == 3 and got["deprecatedSource"] == {"component": "tfusion-scheduler"}
    assert got["deprecatedFirstTimestamp"] == "2026-01-01T00:00:00Z"
    assert got["deprecatedLastTimestamp"] == "2026-01-01T00:05:00Z"
    assert not {"involvedObject", "message", "count", "source", "reportingComponent"} & set(got)


def test_a_new_api_event_reads_in_the_core_shape(http: httpx.Client) -> None:
    answer = created(http, NEW, new_event("allocated"))
    assert answer["apiVersion"] == "events.k8s.io/v1" and answer["note"] == "one vGPU"
    got = http.get(f"{CORE}/allocated").json()
    assert got["apiVersion"] == "v1" and got["involvedObject"]["name"] == "web-1"
    assert got["message"] == "one vGPU" and got["reportingComponent"] == "tfusion/controller"
    assert got["series"]["count"] == 2 and got["action"] == "Allocate"
    assert "note" not in got and "regarding" not in got


def test_both_lists_hold_the_same_events(http: httpx.Client) -> None:
    created(http, CORE, core_event("from-core"))
    created(http, NEW, new_event("from-new"))
    core = http.get(CORE).json()
    new = http.get(NEW).json()
    assert new["kind"] == "EventList" and new["apiVersion"] == "events.k8s.io/v1"
    names = {"from-core", "from-new"}
    assert {e["metadata"]["name"] for e in core["items"]} >= names
    assert {e["metadata"]["name"] for e in new["items"]} == {e["metadata"]["name"] for e in core["items"]}
    assert all(e["apiVersion"] == "events.k8s.io/v1" and "message" not in e for e in new["items"])


def test_a_patch_through_the_new_api_changes_the_core_event(http: httpx.Client) -> None:
    created(http, CORE, core_event("patched"))
    series = {"series": {"count": 4, "lastObservedTime": "2026-01-01T00:09:00.000000Z"}}
    response = http.patch(f"{NEW}/patched", content=json.dumps(series), headers=MERGE)
    assert response.status_code == 200, response.text
    assert response.json()["series"]["count"] == 4
    assert http.get(f"{CORE}/patched").json()["series"]["count"] == 4


def test_the_new_api_keeps_what_an_event_says_but_core_may_change_it(http: httpx.Client) -> None:
    created(http, NEW, new_event("fixed"))
    refused = http.patch(f"{NEW}/fixed", content=json.dumps({"note": "rewritten"}), headers=MERGE)
    assert refused.status_code == 422, refused.text
    [cause] = refused.json()["details"]["causes"]
    assert cause["field"] == "note" and "immutable" in cause["message"]
    changed = http.patch(f"{CORE}/fixed", content=json.dumps({"message": "rewritten"}), headers=MERGE)
    assert changed.status_code == 200, changed.text
    assert http.get(f"{NEW}/fixed").json()["note"] == "rewritten"


def test_deleting_through_one_api_deletes_from_the_other(http: httpx.Client) -> None:
    created(http, NEW, new_event("gone"))
    assert http.delete(f"{CORE}/gone").status_code == 200
    assert http.get(f"{NEW}/gone").status_code == 404


def test_a_watch_on_the_new_api_sees_a_core_event(apiserver: Any, http: httpx.Client) -> None:
    rv = http.get(NEW).json()["metadata"]["resourceVersion"]
    with apiserver.sync_http(timeout=30) as watcher, watcher.stream(
        "GET", NEW, params={"watch": "true", "resourceVersion": rv, "timeoutSeconds": "20"}
    ) as stream:
        created(http, CORE, core_event("watched"))
        for line in stream.iter_lines():
            event = json.loads(line)
            if event["object"]["metadata"].get("name") == "watched":
                break
    assert event["type"] == "ADDED"
    assert event["object"]["apiVersion"] == "events.k8s.io/v1" and event["object"]["note"] == "bound to node-a"


def test_discovery_lists_the_events_group(http: httpx.Client) -> None:
    groups = http.get("/apis").json()["groups"]
    assert any(g["name"] == "events.k8s.io" and g["preferredVersion"]["version"] == "v1" for g in groups)
    resources = http.get("/apis/events.k8s.io/v1").json()["resources"]
    events = next(r for r in resources if r["name"] == "events")
    assert events["kind"] == "Event" and events["namespaced"] is True and "watch" in events["verbs"]


def test_a_core_write_with_the_new_field_names_drops_them(http: httpx.Client) -> None:
    body = {**core_event("mixed"), "note": "not a core field"}
    created(http, CORE, body)
    assert http.get(f"{NEW}/mixed").json()["note"] == "bound to node-a"


def test_the_new_api_table_shows_object_and_message(http: httpx.Client) -> None:
    created(http, CORE, core_event("tabled"))
    table = http.get(NEW, headers={"accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}).json()
    names = [c["name"] for c in table["columnDefinitions"]]
    row = next(r for r in table["rows"] if r["object"]["metadata"]["name"] == "tabled")
    cells = dict(zip(names, row["cells"], strict=True))
    assert cells["Object"] == "pod/web-0" and cells["Message"] == "bound to node-a"


def test_events_stored_apart_by_an_earlier_version_join_the_core_store(tmp_path: Path) -> None:
    state, kubeconfig = tmp_path / "state.db", tmp_path / "kubeconfig"
    first = ApiServerHandle(state, kubeconfig).start()
    first.stop()
    legacy = {**new_event("earlier"), "metadata": {"name": "earlier", "namespace": "default", "uid": "u-earlier",
                                                   "resourceVersion": "1"}}
    with closing(sqlite3.connect(state)) as db, db:
        db.execute("INSERT INTO objects (skey, ns, name, rv, data) VALUES (?, ?, ?, ?, ?)",
                   ("events.k8s.io/events", "default", "earlier", 1, json.dumps(legacy).encode()))
    second = ApiServerHandle(state, kubeconfig).start()
    try:
        with second.sync_http() as http:
            core = http.get(f"{CORE}/earlier").json()
            assert core["message"] == "one vGPU" and core["metadata"]["uid"] == "u-earlier"
            assert http.get(f"{NEW}/earlier").json()["note"] == "one vGPU"
    finally:
        second.stop()
    with closing(sqlite3.connect(state)) as db:
        left = db.execute("SELECT COUNT(*) FROM objects WHERE skey = 'events.k8s.io/events'").fetchone()
    assert left == (0,)


# ------------------------------------------------------------------------------ field selectors
def about(name: str, pod: str, *, kind: str = "Pod", reason: str = "Allocated", kind_of_event: str = "Normal",
          controller: str = "tfusion/controller") -> dict[str, Any]:
    """An events.k8s.io/v1 event about `pod` (or another kind of object)."""
    regarding = {"apiVersion": "v1", "kind": kind, "name": pod, "namespace": "default"}  # kubectl events --for asks
    return {**new_event(name), "regarding": regarding,
            "reason": reason, "type": kind_of_event, "reportingController": controller}


def names(listing: httpx.Response) -> set[str]:
    assert listing.status_code == 200, listing.text
    return {e["metadata"]["name"] for e in listing.json()["items"]}


@pytest.fixture
def selectable(http: httpx.Client) -> httpx.Client:
    created(http, NEW, about("sel-a", "alpha"))
    created(http, NEW, about("sel-b", "beta", reason="Evicted", kind_of_event="Warning", controller="tfusion/kubelet"))
    created(http, NEW, about("sel-c", "alpha", kind="Node"))
    created(http, CORE, {**core_event("sel-d"), "involvedObject": {"kind": "Pod", "name": "alpha",
                                                                     "namespace": "default"}})
    return http


@pytest.mark.parametrize(("selector", "expected"), [
    ("regarding.name=alpha", {"sel-a", "sel-c", "sel-d"}),
    ("regarding.name=alpha,regarding.kind=Pod", {"sel-a", "sel-d"}),
    ("regarding.kind!=Pod,regarding.namespace=default", {"sel-c"}),
    ("reportingController=tfusion/kubelet", {"sel-b"}),
    ("reportingController=tfusion/scheduler", {"sel-d"}),
    ("reason=Evicted", {"sel-b"}),
    ("type=Warning", {"sel-b"}),
    ("metadata.name=sel-c", {"sel-c"}),
])
def test_the_new_api_selects_on_its_own_field_names(selectable: httpx.Client, selector: str,
                                                     expected: set[str]) -> None:
    listed = names(selectable.get(NEW, params={"fieldSelector": selector}))
    assert {n for n in listed if n.startswith("sel-")} == expected


def test_the_core_api_selects_the_same_events_on_its_names(selectable: httpx.Client) -> None:
    by_core = names(selectable.get(CORE, params={"fieldSelector": "involvedObject.name=alpha,involvedObject.kind=Pod"}))
    by_new = names(selectable.get(NEW, params={"fieldSelector": "regarding.name=alpha,regarding.kind=Pod"}))
    assert by_core == by_new == {"sel-a", "sel-d"}
    assert names(selectable.get(CORE, params={"fieldSelector": "source=tfusion-scheduler"})) >= {"sel-d"}


@pytest.mark.parametrize("label", ["note", "involvedObject.name", "regarding.labels", "deprecatedCount"])
def test_the_new_api_refuses_a_field_label_kube_does_not_support(http: httpx.Client, label: str) -> None:
    refused = http.get(NEW, params={"fieldSelector": f"{label}=x"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["message"].startswith(f"field label not supported: {label}")


def test_a_watch_on_the_new_api_selects_on_regarding_name(apiserver: Any, http: httpx.Client) -> None:
    rv = http.get(NEW).json()["metadata"]["resourceVersion"]
    params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "20", "fieldSelector": "regarding.name=wanted"}
    with apiserver.sync_http(timeout=30) as watcher, watcher.stream("GET", NEW, params=params) as stream:
        created(http, NEW, about("w-other", "other"))
        created(http, NEW, about("w-wanted", "wanted"))
        event = json.loads(next(stream.iter_lines()))
    assert event["type"] == "ADDED" and event["object"]["metadata"]["name"] == "w-wanted"


# ------------------------------------------------------------------------------ validation of writes
def without(*fields: str) -> dict[str, Any]:
    return {k: v for k, v in new_event("checked").items() if k not in fields}


@pytest.mark.parametrize(("body", "field", "words"), [
    (without("eventTime"), "eventTime", "Required value"),
    (without("reportingController"), "reportingController", "Required value"),
    (without("reportingInstance"), "reportingInstance", "Required value"),
    (without("action"), "action", "Required value"),
    (without("reason"), "reason", "Required value"),
    ({**new_event("checked"), "type": "Info"}, "type", '"Info"'),
    ({**new_event("checked"), "reportingController": "Not A/Name!"}, "reportingController", "prefix"),
    ({**new_event("checked"), "action": "a" * 129}, "action", "at most 128 characters"),
    ({**new_event("checked"), "note": "n" * 1025}, "note", "at most 1024 characters"),
    ({**new_event("checked"), "deprecatedCount": 3}, "deprecatedCount", "needs to be unset"),
    ({**new_event("checked"), "deprecatedSource": {"component": "x"}}, "deprecatedSource", "needs to be unset"),
    ({**new_event("checked"), "series": {"count": 1, "lastObservedTime": "2026-01-01T00:00:00.000000Z"}},
     "series.count", "at least 2"),
    ({**new_event("checked"), "series": {"count": 2}}, "series.lastObservedTime", "Required value"),
    ({**new_event("checked"), "regarding": {"kind": "Node", "name": "n1"}, "metadata": {"name": "checked",
                                                                                        "namespace": "team"}},
     "regarding.namespace", "does not match"),
    ({**new_event("checked"), "metadata": {"name": "Not_A_Subdomain"}}, "metadata.name", "RFC 1123"),
])
def test_an_incomplete_new_api_event_is_refused_naming_the_field(http: httpx.Client, body: dict[str, Any],
                                                                 field: str, words: str) -> None:
    namespace = body["metadata"].get("namespace", "default")
    if namespace != "default":
        http.post("/api/v1/namespaces", json={"metadata": {"name": namespace}})
    refused = http.post(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", json=body)
    assert refused.status_code == 422, refused.text
    causes = refused.json()["details"]["causes"]
    assert any(c["field"] == field and words in c["message"] for c in causes), causes


def test_all_missing_fields_are_named_at_once(http: httpx.Client) -> None:
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "bare"},
            "eventTime": "2026-01-01T00:00:00.000000Z", "regarding": {"kind": "Pod", "name": "p",
                                                                      "namespace": "default"}}
    refused = http.post(NEW, json=body)
    assert refused.status_code == 422
    fields = {c["field"] for c in refused.json()["details"]["causes"]}
    assert fields == {"reportingController", "reportingInstance", "action", "reason", "type"}


def test_a_lenient_core_write_is_still_accepted(http: httpx.Client) -> None:
    body = {"metadata": {"name": "loose"}, "reason": "R", "involvedObject": {"kind": "Pod", "name": "p"}}
    assert http.post(CORE, json=body).status_code == 201


# ------------------------------------------------------------------------------ real clients


@needs_kubectl
def test_kubectl_selects_and_lists_events_of_both_apis(apiserver: Any, http: httpx.Client, tmp_path: Path) -> None:
    kubectl = Kubectl(apiserver.kubeconfig, tmp_path / "kubectl-cache")
    created(http, NEW, about("k-web", "web-7", reason="Allocated"))
    created(http, NEW, about("k-other", "db-1", reason="Evicted", kind_of_event="Warning"))
    shown = kubectl("get", "events.events.k8s.io", "--field-selector", "regarding.name=web-7",
                    "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert shown == ["k-web"]
    table = kubectl("get", "events.events.k8s.io", "--field-selector", "reason=Evicted").stdout
    assert "pod/db-1" in table and "pod/web-7" not in table
    refused = kubectl("get", "events.events.k8s.io", "--field-selector", "note=x", check=False)
    assert refused.returncode != 0 and "field label not supported: note" in refused.stderr
    events = kubectl("events", "--for", "pod/web-7").stdout.splitlines()
    assert len(events) == 2 and "Allocated" in events[1] and "one vGPU" in events[1], events
    warnings = kubectl("events", "--types", "Warning").stdout
    assert "Evicted" in warnings and "Allocated" not in warnings


def test_the_official_client_writes_and_selects_new_api_events(apiserver: Any) -> None:
    config = official_client(apiserver.kubeconfig)
    api = kube_client.EventsV1Api(config)
    when = datetime(2026, 1, 1, tzinfo=UTC)
    body = kube_client.EventsV1Event(
        metadata=kube_client.V1ObjectMeta(name="py-made"), event_time=when,
        reporting_controller="example.com/trainer", reporting_instance="trainer-0", action="Checkpoint",
        reason="Saved", type="Normal", note="epoch 3 saved",
        regarding=kube_client.V1ObjectReference(kind="Pod", name="trainer-0", namespace="default"))
    api.create_namespaced_event("default", body)
    found = api.list_namespaced_event("default", field_selector="regarding.name=trainer-0").items
    assert [(e.metadata and e.metadata.name, e.note, e.reporting_controller) for e in found] == [
        ("py-made", "epoch 3 saved", "example.com/trainer")]
    incomplete = kube_client.EventsV1Event(metadata=kube_client.V1ObjectMeta(name="py-bare"), event_time=when)
    with pytest.raises(kube_client.ApiException) as refused:
        api.create_namespaced_event("default", incomplete)
    assert refused.value.status == 422 and "reportingController" in str(refused.value.body)
