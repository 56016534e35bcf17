"""Integer query parameters of the API server follow Go's strconv.ParseInt(s, 10, 64) (issue 23, item 3).

kube-apiserver decodes limit, timeoutSeconds and gracePeriodSeconds with ParseInt and resourceVersion
with ParseUint: an optional sign and ASCII digits within 64 bits. Python's int() took " 5", "1_0" and
other scripts' digits, and float() took "1.5"; here each is a 400 naming the parameter and the value,
and every value Go takes is taken, int64's maximum included.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.apiserver_fixture import ApiServerHandle

CMS = "/api/v1/namespaces/default/configmaps"
INT64_MAX = "9223372036854775807"
TOO_BIG = "9223372036854775808"

LIST_CASES: list[tuple[str, str, int]] = [
    ("limit", "1", 200),
    ("limit", "+1", 200),
    ("limit", "007", 200),
    ("limit", "-1", 200),  # no limit, as in kube
    ("limit", INT64_MAX, 200),
    ("limit", TOO_BIG, 400),
    ("limit", " 1", 400),
    ("limit", "1 ", 400),
    ("limit", "1_0", 400),
    ("limit", "\u0661", 400),
    ("limit", "1e3", 400),
    ("limit", "1.0", 400),
    ("limit", "0x1", 400),
    ("timeoutSeconds", "5", 200),
    ("timeoutSeconds", INT64_MAX, 200),
    ("timeoutSeconds", TOO_BIG, 400),
    ("timeoutSeconds", "soon", 400),
    ("resourceVersion", "0", 200),
    ("resourceVersion", "18446744073709551615", 200),
    ("resourceVersion", "18446744073709551616", 400),
    ("resourceVersion", "+1", 400),
    ("resourceVersion", "abc", 400),
]


@pytest.fixture
def client(apiserver: ApiServerHandle) -> Iterator[httpx.Client]:
    with apiserver.sync_http(timeout=30) as http:
        for name in ("a", "b"):
            assert http.post(CMS, json={"metadata": {"name": name}}).status_code == 201
        yield http


def assert_named_400(response: httpx.Response, key: str, value: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert key in message and repr(value) in message and "allowed" in message, message


@pytest.mark.parametrize(("key", "value", "code"), LIST_CASES)
def test_list_parameters(client: httpx.Client, key: str, value: str, code: int) -> None:
    response = client.get(CMS, params={key: value})
    if code == 400:
        assert_named_400(response, key, value)
    else:
        assert response.status_code == 200, response.text


def test_limit_pages_with_a_signed_value(client: httpx.Client) -> None:
    page = client.get(CMS, params={"limit": "+1"}).json()
    assert len(page["items"]) == 1 and page["metadata"]["continue"]


@pytest.mark.parametrize("value", ["-1", "1.5", "nan", " 1", TOO_BIG, "1_0"])
def test_watch_refuses_a_bad_timeout(client: httpx.Client, value: str) -> None:
    response = client.get(CMS, params={"watch": "true", "timeoutSeconds": value})
    assert response.status_code == 400 and "timeoutSeconds" in response.text, response.text


def test_watch_takes_the_largest_int64_timeout(client: httpx.Client) -> None:
    params = {"watch": "true", "timeoutSeconds": INT64_MAX, "resourceVersion": "0"}
    with client.stream("GET", CMS, params=params) as response:
        assert response.status_code == 200
        first = next(response.iter_lines())
        assert '"ADDED"' in first


@pytest.mark.parametrize(("value", "code"), [("0", 200), ("+0", 200), (INT64_MAX, 200), (TOO_BIG, 400),
                                             ("1.5", 400), (" 0", 400), ("-1", 400), ("0x0", 400)])
def test_delete_grace_period(client: httpx.Client, value: str, code: int) -> None:
    response = client.delete(f"{CMS}/a", params={"gracePeriodSeconds": value})
    assert response.status_code == code, response.text
    if code == 400:
        assert "gracePeriodSeconds" in response.text
        assert client.get(f"{CMS}/a").status_code == 200


@pytest.mark.parametrize("body", [b'{"gracePeriodSeconds":"5"}', b'{"gracePeriodSeconds":1.5}',
                                  b'{"gracePeriodSeconds":9223372036854775808}', b'{"gracePeriodSeconds":true}'])
def test_delete_grace_period_in_the_body_is_a_json_integer(client: httpx.Client, body: bytes) -> None:
    response = client.request("DELETE", f"{CMS}/a", content=body)
    assert response.status_code == 400 and "gracePeriodSeconds" in response.text, response.text
    assert client.get(f"{CMS}/a").status_code == 200


@pytest.mark.parametrize(("key", "value"), [("limit", "1_0"), ("timeoutSeconds", TOO_BIG), ("resourceVersion", "-1")])
def test_deletecollection_checks_its_list_options(client: httpx.Client, key: str, value: str) -> None:
    assert_named_400(client.delete(CMS, params={key: value}), key, value)
    assert len(client.get(CMS).json()["items"]) == 2
