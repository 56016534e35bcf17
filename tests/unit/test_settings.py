"""Settings: every environment override, flag/env precedence, bad values and the kube mode.

Each option with an environment variable has a case in ENV_CASES; a completeness test fails when an
option gains an `env` without one. Nothing here touches os.environ: `Settings.load(env=...)`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tfusion.settings import OPTIONS, Option, Settings, SettingsError, option

# attr -> (environment text, expected value, a bad environment text or None when any text is valid)
ENV_CASES: dict[str, tuple[str, Any, str | None]] = {
    "kubeconfig_env": ("/tmp/kc.yaml", "/tmp/kc.yaml", None),
    "log_level": ("debug", "debug", "loud"),
    "node_name": ("gpu-node-7", "gpu-node-7", None),
    "pod_name": ("tf-controller-0", "tf-controller-0", None),
    "pod_namespace": ("tf-system", "tf-system", None),
    "domain_prefix": ("acme-gpu", "acme-gpu", None),
    "domain_suffix": ("example.com", "example.com", None),
    "testing": ("true", True, "perhaps"),
    "controller_listen": ("9090", ":9090", "not-an-address"),
    "operator_namespace": ("gpu-ops", "gpu-ops", None),
    "isolation_mode_policy": ("dynamic", "dynamic", "sometimes"),
    "enable_webhooks": ("false", False, "nope"),
    "enable_scheduler": ("false", False, "nah"),
    "enable_cr_controller": ("false", False, "2"),
    "progressive_migration": ("true", True, "maybe"),
    "initial_gpu_node_label_selector": ("gpu=yes", "gpu=yes", None),
    "hypervisor_port": ("9001", 9001, "eighty"),
    "vendor": ("AMD", "AMD", None),
    "state_dir": ("/var/lib/tf", "/var/lib/tf", None),
    "pool_name": ("pool-a", "pool-a", None),
    "hardware_metadata": ('[{"model": "A100"}]', '[{"model": "A100"}]', None),
    "scheduling_config": ('{"autoFreeze": []}', '{"autoFreeze": []}', None),
    "metrics_format": ("json", "json", "xml"),
    "metrics_extra_labels": ('{"team": "team"}', '{"team": "team"}', None),
    "detect_in_used_gpus": ("1", True, "yes please"),
}

ENV_OPTIONS = [opt for opt in OPTIONS if opt.env]


def _load(flags: dict[str, Any] | None = None, env: dict[str, str] | None = None,
          roles: tuple[str, ...] = ("all",)) -> Settings:
    return Settings.load(flags or {}, env=env or {}, roles=roles)


def test_every_env_option_has_a_case() -> None:
    missing = sorted(opt.env or "" for opt in ENV_OPTIONS if opt.attr not in ENV_CASES)
    assert not missing, f"add ENV_CASES entries for {missing}"
    assert set(ENV_CASES) <= {opt.attr for opt in ENV_OPTIONS}


def test_defaults_without_env_or_flags() -> None:
    settings = _load()
    for opt in OPTIONS:
        assert getattr(settings, opt.attr) == opt.default, opt.attr
    assert settings.roles == ("all",)


@pytest.mark.parametrize("opt", ENV_OPTIONS, ids=[opt.env or "" for opt in ENV_OPTIONS])
def test_env_overrides_default(opt: Option) -> None:
    text, expected, _ = ENV_CASES[opt.attr]
    assert expected != opt.default, "the case must differ from the default to prove the override"
    assert opt.env is not None
    settings = _load(env={opt.env: text})
    assert getattr(settings, opt.attr) == expected
    # other options keep their defaults
    untouched = next(o for o in OPTIONS if o.attr != opt.attr and o.env != opt.env)
    assert getattr(settings, untouched.attr) == untouched.default


@pytest.mark.parametrize("opt", ENV_OPTIONS, ids=[opt.env or "" for opt in ENV_OPTIONS])
def test_empty_env_counts_as_unset(opt: Option) -> None:
    assert opt.env is not None
    assert getattr(_load(env={opt.env: ""}), opt.attr) == opt.default


_FLAG_AND_ENV = [opt for opt in ENV_OPTIONS if opt.flag]


@pytest.mark.parametrize("opt", _FLAG_AND_ENV, ids=[opt.env or "" for opt in _FLAG_AND_ENV])
def test_flag_and_env_precedence(opt: Option) -> None:
    text, env_value, _ = ENV_CASES[opt.attr]
    flag_value = _flag_sample(opt)
    assert flag_value not in (env_value, opt.default)
    assert opt.env is not None
    settings = _load(flags={opt.attr: flag_value}, env={opt.env: text})
    if opt.env_wins:
        assert getattr(settings, opt.attr) == env_value, f"{opt.env} must win over {opt.flag}"
    else:
        assert getattr(settings, opt.attr) == flag_value, f"{opt.flag} must win over {opt.env}"
    # the flag alone is used when the environment is silent
    assert getattr(_load(flags={opt.attr: flag_value}), opt.attr) == flag_value


def _flag_sample(opt: Option) -> Any:
    samples: dict[str, Any] = {
        "log_level": "warn", "node_name": "flag-node", "controller_listen": ":7070",
        "operator_namespace": "flag-ns", "hypervisor_port": 7001, "vendor": "Ascend",
        "state_dir": "/flag/state",
    }
    return samples[opt.attr]


def test_only_hypervisor_port_and_vendor_let_the_environment_win() -> None:
    assert {opt.env for opt in OPTIONS if opt.env_wins} == {"HYPERVISOR_PORT", "TF_HARDWARE_VENDOR"}


def test_env_wins_options_named_in_the_help() -> None:
    for attr in ("hypervisor_port", "vendor"):
        opt = option(attr)
        assert opt.env is not None and opt.env in opt.help


@pytest.mark.parametrize("attr", [a for a, case in ENV_CASES.items() if case[2] is not None])
def test_bad_env_value_names_the_variable(attr: str) -> None:
    opt = option(attr)
    bad = ENV_CASES[attr][2]
    assert opt.env is not None and bad is not None
    with pytest.raises(SettingsError) as info:
        _load(env={opt.env: bad})
    message = str(info.value)
    assert opt.env in message
    assert repr(bad) in message
    assert "\n" not in message


def test_bad_env_value_fails_even_when_a_flag_is_given() -> None:
    # a flag wins over the environment, so an invalid environment value is ignored there ...
    settings = _load(flags={"log_level": "warn"}, env={"TF_LOG_LEVEL": "loud"})
    assert settings.log_level == "warn"
    # ... but an env-wins variable is always read, so its bad value is an error
    with pytest.raises(SettingsError, match="HYPERVISOR_PORT"):
        _load(flags={"hypervisor_port": 7001}, env={"HYPERVISOR_PORT": "eighty"})


@pytest.mark.parametrize("text", ["65536", "-1", "99999", "80.5"])
def test_hypervisor_port_must_be_a_port(text: str) -> None:
    with pytest.raises(SettingsError, match=r"HYPERVISOR_PORT.*expected a port number from 0 to 65535"):
        _load(env={"HYPERVISOR_PORT": text})


def test_hypervisor_port_zero_means_any_free_port() -> None:
    assert _load(env={"HYPERVISOR_PORT": "0"}).hypervisor_port == 0


@pytest.mark.parametrize(("text", "expected"), [("8080", ":8080"), (":9000", ":9000"),
                                                ("127.0.0.1:80", "127.0.0.1:80"),
                                                ("[::1]:8080", "[::1]:8080")])
def test_controller_port_env_accepts_ports_and_addresses(text: str, expected: str) -> None:
    assert _load(env={"PORT": text}).controller_listen == expected


@pytest.mark.parametrize("text", ["70000", "host", "host:port"])
def test_controller_port_env_rejects_garbage(text: str) -> None:
    with pytest.raises(SettingsError, match="PORT"):
        _load(env={"PORT": text})


def test_unknown_flag_attribute_is_rejected() -> None:
    with pytest.raises(SettingsError, match=r"unknown setting.*no_such_thing"):
        _load(flags={"no_such_thing": 1})


def test_none_flag_means_not_given() -> None:
    assert _load(flags={"log_level": None}, env={"TF_LOG_LEVEL": "error"}).log_level == "error"


# --- kube mode -------------------------------------------------------------------------------------------


def test_kube_mode_embedded_for_all() -> None:
    assert _load(roles=("all",)).kube_mode == "embedded"
    assert _load(roles=("all",), env={"KUBECONFIG": "/tmp/kc"}).kube_mode == "embedded"


def test_kube_mode_flag_wins() -> None:
    assert _load(flags={"kube": "in-cluster"}, roles=("all",)).kube_mode == "in-cluster"
    assert _load(flags={"kube": "/etc/kc"}, roles=("controller",),
                 env={"KUBECONFIG": "/tmp/other"}).kube_mode == "/etc/kc"
    assert _load(flags={"kube": "embedded"}, roles=("hypervisor",)).kube_mode == "embedded"


def test_kube_mode_kubeconfig_env_then_in_cluster() -> None:
    assert _load(roles=("controller",), env={"KUBECONFIG": "/tmp/kc"}).kube_mode == "/tmp/kc"
    home_relative = _load(roles=("hypervisor",), env={"KUBECONFIG": "~/kc"}).kube_mode
    assert home_relative == str(Path("~/kc").expanduser())
    assert _load(roles=("controller", "hypervisor")).kube_mode == "in-cluster"


# --- small conveniences ------------------------------------------------------------------------------------


def test_settings_are_frozen_and_replaceable() -> None:
    settings = _load()
    with pytest.raises(AttributeError):
        settings.log_level = "debug"  # type: ignore[misc]
    changed = settings.replace(log_level="debug")
    assert changed.log_level == "debug" and settings.log_level == "info"


def test_has_role_and_domain() -> None:
    assert _load(roles=("all",)).has_role("hypervisor")
    assert not _load(roles=("controller",)).has_role("hypervisor")
    custom = _load(env={"TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX": "acme",
                        "TENSOR_FUSION_CUSTOM_DOMAIN_SUFFIX": "io"})
    assert custom.domain == "acme.io"
    assert _load().domain == "tensor-fusion.ai"


def test_resolved_node_name_falls_back_to_the_host_name() -> None:
    import socket

    assert _load(env={"GPU_NODE_NAME": "n1"}).resolved_node_name == "n1"
    assert _load().resolved_node_name == socket.gethostname().lower()
