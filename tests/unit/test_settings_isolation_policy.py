"""TF_ISOLATION_MODE_POLICY / --isolation-mode-policy: both values start (case-insensitive, as the
original reads them), a bad value exits with an error naming the variable and what is allowed, and
the hypervisor of --role=all follows the controller's policy."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_main, run_tfusion
from tfusion import cli
from tfusion.settings import Settings, SettingsError


@pytest.mark.parametrize(("text", "expected"), [("static", "static"), ("dynamic", "dynamic"),
                                                ("DYNAMIC", "dynamic"), (" Static ", "static")])
def test_both_values_are_read_case_insensitively(text: str, expected: str) -> None:
    settings = Settings.load({}, env={"TF_ISOLATION_MODE_POLICY": text}, roles=("controller",))
    assert settings.isolation_mode_policy == expected


def test_the_default_is_static_and_the_flag_sets_it() -> None:
    assert Settings.load({}, env={}, roles=("controller",)).isolation_mode_policy == "static"
    given = cli.settings_from_args(["--role=controller", "--isolation-mode-policy=Dynamic"])
    assert given.isolation_mode_policy == "dynamic"


def test_the_flag_wins_over_the_variable() -> None:
    flagged = Settings.load({"isolation_mode_policy": "static"}, env={"TF_ISOLATION_MODE_POLICY": "dynamic"},
                            roles=("controller",))
    assert flagged.isolation_mode_policy == "static"
    assert Settings.load({"isolation_mode_policy": "dynamic"}, env={}, roles=("controller",)) \
        .isolation_mode_policy == "dynamic"


def test_a_bad_value_names_the_variable_the_value_and_the_choices() -> None:
    with pytest.raises(SettingsError) as info:
        Settings.load({}, env={"TF_ISOLATION_MODE_POLICY": "flexible"}, roles=("controller",))
    assert str(info.value) == ("environment variable TF_ISOLATION_MODE_POLICY='flexible': expected static or "
                               "dynamic (case-insensitive), got 'flexible'")


def test_a_bad_flag_value_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["--role=controller", "--isolation-mode-policy=flexible"], capsys)
    assert code == 2
    assert "--isolation-mode-policy" in err and "expected static or dynamic" in err


def test_the_real_entry_point_refuses_a_bad_variable() -> None:
    result = run_tfusion("--role=controller", "--kube=in-cluster", env={"TF_ISOLATION_MODE_POLICY": "sometimes"})
    assert result.returncode != 0
    assert "TF_ISOLATION_MODE_POLICY='sometimes'" in result.stderr
    assert "expected static or dynamic" in result.stderr


def test_the_hypervisor_of_role_all_follows_the_controller_policy() -> None:
    env = {"TF_ISOLATION_MODE_POLICY": "dynamic"}
    assert Settings.load({}, env=env, roles=("all",)).resolved_hypervisor_isolation_policy == "dynamic"
    alone = Settings.load({"isolation_policy": "static"}, env=env, roles=("hypervisor",))
    assert alone.resolved_hypervisor_isolation_policy == "static"
    flagged = Settings.load({"isolation_policy": "dynamic"}, env={}, roles=("hypervisor",))
    assert flagged.resolved_hypervisor_isolation_policy == "dynamic"
