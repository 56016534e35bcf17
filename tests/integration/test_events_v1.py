"""Events through both APIs: `core/v1` and `events.k8s.io/v1` are one store in two shapes, so an
event written through either is listed, read, watched and patched through the other, with the newer
API's field names (note, regarding, reportingController, deprecated*)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle

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
    response = http.patch(f"{NEW}/patched", content=json.dumps({"note": "moved to node-b"}), headers=MERGE)
    assert response.status_code == 200, response.text
    assert response.json()["note"] == "moved to node-b"
    assert http.get(f"{CORE}/patched").json()["message"] == "moved to node-b"


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
