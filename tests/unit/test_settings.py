"""Settings: every environment override, flag/env precedence, bad values and the kube mode.

Each implemented option with an environment variable has a case in ENV_CASES; a completeness test
fails when an option gains an `env` without one. Options declared but not implemented yet are refused
when set (`NOT_IMPLEMENTED_FOUND` pins the ones known today). Nothing here touches os.environ:
`Settings.load(env=...)`.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import anyio
import pytest

from tfusion import roles
from tfusion import settings as settings_module
from tfusion.settings import (
    NOT_IMPLEMENTED,
    OPTIONS,
    NotImplementedSettingError,
    Option,
    Settings,
    SettingsError,
    not_implemented_options,
    option,
    parse_duration,
)

# attr -> (environment text, expected value, a bad environment text or None when any text is valid)
ENV_CASES: dict[str, tuple[str, Any, str | None]] = {
    "kubeconfig_env": ("/tmp/kc.yaml", "/tmp/kc.yaml", None),
    "log_level": ("debug", "debug", "loud"),
    "event_loop": ("asyncio", "asyncio", "tokio"),
    "node_name": ("gpu-node-7", "gpu-node-7", None),
    "pod_name": ("tf-controller-0", "tf-controller-0", None),
    "pod_namespace": ("tf-system", "tf-system", None),
    "domain_prefix": ("acme-gpu", "acme-gpu", None),
    "domain_suffix": ("example.com", "example.com", None),
    "controller_listen": ("9090", ":9090", "not-an-address"),
    "operator_namespace": ("gpu-ops", "gpu-ops", None),
    "hypervisor_port": ("9001", 9001, "eighty"),
    "hypervisor_host": ("[::1]", "::1", "my-host"),
    "vendor": ("AMD", "AMD", None),
    "state_dir": ("/var/lib/tf", "/var/lib/tf", None),
    "pool_name": ("pool-a", "pool-a", None),
    "hardware_metadata": ('[{"model": "A100"}]', '[{"model": "A100"}]', None),
    "scheduling_config": ('{"autoFreeze": []}', '{"autoFreeze": []}', None),
    "metrics_format": ("json", "json", "xml"),
    "metrics_push_url": ("http://127.0.0.1:4000/v1/influxdb/write", "http://127.0.0.1:4000/v1/influxdb/write",
                         "ftp://db.example/write"),
    "metrics_extra_labels": ('{"team": "team"}', '{"team": "team"}', None),
    "enable_webhooks": ("false", False, "maybe"),
    "enable_scheduler": ("false", False, "maybe"),
    "preempt_cluster_wide": ("false", False, "everywhere"),
    "enable_cr_controller": ("false", False, "nope"),
    "detect_in_used_gpus": ("true", True, "sometimes"),
    "initial_gpu_node_label_selector": (" nvidia.com/gpu.present=true ", "nvidia.com/gpu.present=true",
                                        "gpu in true"),
    "disable_connection_auth": ("true", True, "maybe"),
    "progressive_migration": ("true", True, "maybe"),
    "limiter_image": ("registry.example/tfusion:9", "registry.example/tfusion:9", None),
    "isolation_mode_policy": ("Dynamic", "dynamic", "both"),
    "autoscaler_usage_source": ("influxdb", "influxdb", "mysql"),
    "limiter_library": ("/etc/passwd", "/etc/passwd", "/nonexistent/libcuda_limiter.so"),
    "provisioning_catalog": ("/etc/hosts", "/etc/hosts", "/nonexistent/catalog.yaml"),
    "cloud_endpoint_url": ("http://127.0.0.1:5000", "http://127.0.0.1:5000", "ftp://ec2.example"),
}

#: the flags an option's cases need besides it (a history usage source needs its server's URL)
NEEDS: dict[str, dict[str, Any]] = {"autoscaler_usage_source": {"autoscaler_usage_url": "http://127.0.0.1:8086"}}

ENV_OPTIONS = [opt for opt in OPTIONS if opt.env and opt.implemented]


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
    settings = _load(flags=NEEDS.get(opt.attr), env={opt.env: text})
    assert getattr(settings, opt.attr) == expected
    # other options keep their defaults
    untouched = next(o for o in OPTIONS if o.attr != opt.attr and o.env != opt.env)
    assert getattr(settings, untouched.attr) == untouched.default


@pytest.mark.parametrize("opt", ENV_OPTIONS, ids=[opt.env or "" for opt in ENV_OPTIONS])
def test_empty_env_counts_as_unset(opt: Option) -> None:
    assert opt.env is not None
    assert getattr(_load(env={opt.env: ""}), opt.attr) == opt.default


#: a two-valued option cannot have a flag sample unlike both its default and its env case: its
#: precedence is tested in test_settings_isolation_policy.py
_TWO_VALUED = {"isolation_mode_policy"}
_FLAG_AND_ENV = [opt for opt in ENV_OPTIONS if opt.flag and opt.attr not in _TWO_VALUED]


@pytest.mark.parametrize("opt", _FLAG_AND_ENV, ids=[opt.env or "" for opt in _FLAG_AND_ENV])
def test_flag_and_env_precedence(opt: Option) -> None:
    text, env_value, _ = ENV_CASES[opt.attr]
    flag_value = _flag_sample(opt)
    assert flag_value not in (env_value, opt.default)
    assert opt.env is not None
    needs = NEEDS.get(opt.attr, {})
    settings = _load(flags={**needs, opt.attr: flag_value}, env={opt.env: text})
    if opt.env_wins:
        assert getattr(settings, opt.attr) == env_value, f"{opt.env} must win over {opt.flag}"
    else:
        assert getattr(settings, opt.attr) == flag_value, f"{opt.flag} must win over {opt.env}"
    # the flag alone is used when the environment is silent
    assert getattr(_load(flags={**needs, opt.attr: flag_value}), opt.attr) == flag_value


@pytest.mark.parametrize(("loop", "role", "uvloop"), [
    ("uvloop", "controller", True), ("asyncio", "apiserver", False),
    ("auto", "apiserver", True), ("auto", "controller", False), ("auto", "all", False),
])
def test_roles_run_on_the_chosen_event_loop(loop: str, role: str, uvloop: bool) -> None:
    async def running_loop_module() -> str:
        return type(asyncio.get_running_loop()).__module__

    settings = _load(flags={"event_loop": loop}, roles=(role,))
    module = anyio.run(running_loop_module, backend_options=roles.backend_options(settings))
    assert module.startswith("uvloop") == uvloop, module


def _flag_sample(opt: Option) -> Any:
    samples: dict[str, Any] = {
        "log_level": "warn", "event_loop": "uvloop", "node_name": "flag-node", "controller_listen": ":7070",
        "operator_namespace": "flag-ns", "hypervisor_port": 7001, "vendor": "Ascend",
        "state_dir": "/flag/state", "hypervisor_host": "10.0.0.1",
        "metrics_push_url": "http://10.0.0.9:8086/write", "autoscaler_usage_source": "greptimedb",
        "limiter_image": "flag.example/tfusion:8",
        "limiter_library": "/etc/group",
        "provisioning_catalog": "/etc/group",
        "cloud_endpoint_url": "http://10.0.0.8:5000",
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


# --- not implemented yet: refused when set, never silently ignored -------------------------------------

#: the options found doing nothing when they were marked; one leaves this list only when it works
NOT_IMPLEMENTED_FOUND = {
    "testing": "GO_TESTING",
}

UNIMPLEMENTED = [opt for opt in not_implemented_options() if not opt.implemented]
UNIMPLEMENTED_ENV = [opt for opt in UNIMPLEMENTED if opt.env]
UNIMPLEMENTED_FLAGS = [opt for opt in UNIMPLEMENTED if opt.flag]


def valid_text(opt: Option) -> str:
    """A value the option's parser accepts: refusing it proves the refusal is not about the value."""
    default = opt.default
    if isinstance(default, bool):
        text = "false" if default else "true"
    elif isinstance(default, tuple):
        text = "-".join(map(str, default))
    elif isinstance(default, float):
        text = f"{default}s"
    else:
        text = str(default) or "gpu=yes"
    opt.parse(text)
    return text


def test_the_options_found_doing_nothing_stay_marked() -> None:
    marked = {opt.attr: opt.names for opt in UNIMPLEMENTED}
    assert NOT_IMPLEMENTED_FOUND.items() <= marked.items()


@pytest.mark.parametrize("opt", UNIMPLEMENTED_ENV, ids=[opt.env or "" for opt in UNIMPLEMENTED_ENV])
def test_setting_an_unimplemented_variable_is_refused_naming_it(opt: Option) -> None:
    assert opt.env is not None
    for text in (valid_text(opt), "garbage that would not parse"):
        with pytest.raises(NotImplementedSettingError) as info:
            _load(env={opt.env: text})
        message = str(info.value)
        assert message == f"environment variable {opt.env} {NOT_IMPLEMENTED}; unset it"


def test_setting_an_unimplemented_flag_is_refused_naming_it() -> None:
    """Every flag works now; the refusal is checked on one marked unimplemented for the test."""
    assert not UNIMPLEMENTED_FLAGS
    marked = dataclasses.replace(option("webhook_listen"), implemented=False)
    for value in (":9443", "not even an address"):
        with pytest.raises(NotImplementedSettingError) as info:
            settings_module._resolve(marked, value, {})
        assert str(info.value) == f"--webhook-listen {NOT_IMPLEMENTED}; leave it out"


def test_a_refusal_is_a_settings_error() -> None:
    assert issubclass(NotImplementedSettingError, SettingsError)


@pytest.mark.parametrize("opt", UNIMPLEMENTED, ids=[opt.attr for opt in UNIMPLEMENTED])
def test_an_unimplemented_option_left_unset_keeps_its_default(opt: Option) -> None:
    env = {opt.env: ""} if opt.env else {}
    assert getattr(_load(env=env), opt.attr) == opt.default


def test_implemented_options_are_not_refused() -> None:
    env = {opt.env: ENV_CASES[opt.attr][0] for opt in ENV_OPTIONS if opt.env}
    settings = _load(flags={k: v for needs in NEEDS.values() for k, v in needs.items()}, env=env)
    assert settings.metrics_format == "json"


# --- each default is written once ------------------------------------------------------------------------


def _settings_field_defaults() -> dict[str, ast.expr | None]:
    """Field name -> the default expression written in the Settings class body."""
    tree = ast.parse(inspect.getsource(settings_module))
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings").body
    return {node.target.id: node.value for node in body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def test_every_option_default_is_written_only_in_its_option() -> None:
    written = _settings_field_defaults()
    for opt in OPTIONS:
        expr = written.get(opt.attr)
        assert expr is not None, f"Settings lacks a field for option {opt.attr}"
        is_lookup = (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "_default"
                     and [ast.literal_eval(arg) for arg in expr.args] == [opt.attr])
        assert is_lookup, f"Settings.{opt.attr} must default to _default({opt.attr!r}), not repeat the value"
    assert set(written) - {opt.attr for opt in OPTIONS} == {"roles", "extra"}


def test_settings_without_arguments_are_the_defaults() -> None:
    plain = Settings()
    assert plain == _load()
    for opt in OPTIONS:
        assert getattr(plain, opt.attr) == opt.default
    assert {f.name for f in dataclasses.fields(Settings)} == {opt.attr for opt in OPTIONS} | {"roles", "extra"}


# --- health probes and durations ---------------------------------------------------------------------------


def test_health_probe_bind_address() -> None:
    opt = option("health_probe_listen")
    assert (opt.flag, opt.env, opt.default, opt.role) == ("--health-probe-bind-address", None, ":8081", "controller")
    assert opt.implemented
    assert _load().health_probe_listen == ":8081"
    assert opt.parse("127.0.0.1:9000") == "127.0.0.1:9000"
    assert opt.parse(":0") == ":0"
    for bad in ("9000", "localhost", "host:port", ":70000"):
        with pytest.raises(ValueError, match="expected HOST:PORT or :PORT"):
            opt.parse(bad)


@pytest.mark.parametrize(("text", "seconds"), [("15", 15.0), ("1m30s", 90.0), ("12h", 43200.0), ("30d", 2592000.0),
                                               ("500ms", 0.5), ("0", 0.0), ("1.5s", 1.5)])
def test_duration_settings_accept_days_and_bare_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "-5s", "5 s", "1w"])
def test_duration_settings_reject_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="expected a duration such as 30s"):
        parse_duration(text)


# --- listening addresses: loopback on a single machine, all interfaces in a cluster ------------------------


@pytest.mark.parametrize(("roles", "listen", "probes"), [
    (("all",), "127.0.0.1:8080", "127.0.0.1:8081"),
    (("controller",), "0.0.0.0:8080", "0.0.0.0:8081"),
    (("controller", "hypervisor"), "0.0.0.0:8080", "0.0.0.0:8081"),
])
def test_controller_listeners_default_to_loopback_only_with_role_all(
        roles: tuple[str, ...], listen: str, probes: str) -> None:
    settings = _load(roles=roles)
    assert (settings.controller_listen, settings.health_probe_listen) == (":8080", ":8081")  # written once
    assert (settings.resolved_controller_listen, settings.resolved_health_probe_listen) == (listen, probes)


def test_a_listener_with_a_host_is_bound_as_written_even_with_role_all() -> None:
    settings = _load({"controller_listen": "0.0.0.0:9090", "health_probe_listen": "[::1]:9091"})
    assert settings.resolved_controller_listen == "0.0.0.0:9090"
    assert settings.resolved_health_probe_listen == "[::1]:9091"
    assert _load({"controller_listen": ":9090"}).resolved_controller_listen == "127.0.0.1:9090"
    assert _load(env={"PORT": "9092"}, roles=("controller",)).resolved_controller_listen == "0.0.0.0:9092"


@pytest.mark.parametrize(("roles", "backend", "host"), [
    (("hypervisor",), "kubernetes", "0.0.0.0"),
    (("hypervisor",), "local", "127.0.0.1"),
    (("all",), "kubernetes", "127.0.0.1"),
    (("controller", "hypervisor"), "kubernetes", "0.0.0.0"),
])
def test_hypervisor_host_defaults_by_role_and_backend(roles: tuple[str, ...], backend: str, host: str) -> None:
    settings = _load({"backend": backend}, roles=roles)
    assert settings.hypervisor_host == option("hypervisor_host").default == ""
    assert settings.resolved_hypervisor_host == host
    assert settings.resolved_hypervisor_listen == f"{host}:8001"


def test_hypervisor_host_flag_and_environment() -> None:
    opt = option("hypervisor_host")
    assert (opt.flag, opt.env, opt.role) == ("--host", "HYPERVISOR_HOST", "hypervisor")
    given = _load({"backend": "local", "hypervisor_host": "0.0.0.0", "hypervisor_port": 9001}, roles=("hypervisor",))
    assert given.resolved_hypervisor_listen == "0.0.0.0:9001"
    assert _load(env={"HYPERVISOR_HOST": "::1"}).resolved_hypervisor_listen == "[::1]:8001"
    with pytest.raises(SettingsError, match=r"HYPERVISOR_HOST='example.com'.*expected an IP address"):
        _load(env={"HYPERVISOR_HOST": "example.com"})


def test_api_token_file_option() -> None:
    opt = option("api_token_file")
    assert (opt.flag, opt.env, opt.default, opt.role) == ("--api-token-file", None, "", "hypervisor")
    assert _load({"api_token_file": "/etc/tf/token"}).api_token_file == "/etc/tf/token"
