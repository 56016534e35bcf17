"""`tfusion console`'s command line: what it refuses before serving, and where the charts come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import run_main
from tfusion.console.cli import ConsoleOptions, check_listen, history_for


def test_an_address_beyond_loopback_needs_a_token() -> None:
    assert check_listen("127.0.0.1:8090", "") == "" and check_listen("[::1]:8090", "") == ""
    assert "--token-file" in check_listen("0.0.0.0:8090", "")
    assert "--token-file" in check_listen(":8090", "")
    assert check_listen("0.0.0.0:8090", "x" * 16) == ""
    assert check_listen("nonsense", "").startswith("--listen: ")


def test_the_charts_source(tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    kubeconfig = str(tmp_path / "kubeconfig")
    beside = history_for(ConsoleOptions(kube=kubeconfig), kubeconfig)
    assert beside is not None and beside.name.startswith("files: ") and beside.name.endswith("metrics")
    assert history_for(ConsoleOptions(kube=""), str(tmp_path / "elsewhere" / "kubeconfig")) is None
    prom = history_for(ConsoleOptions(kube=kubeconfig, prometheus="http://prom:9090"), kubeconfig)
    assert prom is not None and prom.name == "prometheus: http://prom:9090"
    influx = history_for(ConsoleOptions(kube=kubeconfig, influxdb="http://influx:8086"), kubeconfig)
    assert influx is not None and "influxdb: http://influx:8086" in influx.name


@pytest.mark.parametrize(("argv", "says"), [
    (["console", "--listen", "0.0.0.0:8090"], "--token-file"),
    (["console", "--token-file", "/nonexistent/token"], "--token-file: cannot read"),
    (["console", "--prometheus", "prom:9090"], "--prometheus: "),
    (["console", "--prometheus", "http://a", "--influxdb", "http://b"], "not both"),
    (["console", "--bogus"], "unrecognized arguments"),
])
def test_mistakes_exit_2_with_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(argv, capsys)
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_a_short_token_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "token"
    token.write_text("short\n")
    code, _, err = run_main(["console", "--token-file", str(token)], capsys)
    assert code == 2 and "at least 16 characters" in err
