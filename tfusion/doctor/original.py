"""An installation of the original TensorFusion operator: what tfusion would refuse or do differently.

Why: a user switching wants to know before removing the original which of its settings tfusion
cannot take. The original's controller is the Deployment running the `tensor-fusion-operator`
image; its command-line flags (Go style: `-name value`, `-name=value`, a bare `-name` for a
boolean) and environment are judged by tfusion's own settings (`tfusion.settings.OPTIONS` decides:
a flag or variable tfusion has no option for has no effect; one it declares but does not implement
makes tfusion exit 1; a value it cannot parse is refused), and the dynamic config file of each
ConfigMap it mounts by the controller's own validation. Refusals are warnings: the running
installation is not broken, switching would be. A setting tfusion takes but treats differently is
judged by the one table of tfusion.doctor.differences (`info`, or `warning` where the switch changes
what the cluster does), and the operator image's release is compared with the one tfusion implements
(tfusion.doctor.original_version).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import yaml

from tfusion.api.accessors import Body, items, section, sequence_of_maps, text
from tfusion.controller.dynamic_config import validate
from tfusion.doctor.context import Context
from tfusion.doctor.differences import difference_finding
from tfusion.doctor.findings import Finding, ok, warning
from tfusion.doctor.original_version import version_finding
from tfusion.kube import resources as r
from tfusion.kube.client import NotFound
from tfusion.settings import OPTIONS, NotImplementedSettingError, Option, Settings, SettingsError

CHECK = "tensorfusion"
ORIGINAL_IMAGE = "tensor-fusion-operator"  # the chart's tensorfusion/tensor-fusion-operator
_BY_FLAG = {opt.flag.removeprefix("--"): opt for opt in OPTIONS if opt.flag}
_BY_ENV = {opt.env: opt for opt in OPTIONS if opt.env}
#: what the Go runtime and Kubernetes set, not the operator's settings
_NOT_SETTINGS = ("KUBERNETES_", "GO", "HOME", "PATH", "HOSTNAME", "POD_", "NODE_NAME", "TZ")


def original_containers(deployment: Mapping[str, object]) -> list[Mapping[str, object]]:
    pod_spec = section(deployment, "spec", "template", "spec")
    return [c for c in sequence_of_maps(pod_spec.get("containers")) if ORIGINAL_IMAGE in text(c, "image")]


def parse_go_flags(args: Sequence[str]) -> Iterator[tuple[str, str | None]]:
    """(name, value) per flag; value None for a bare boolean flag. Arguments that are no flag are skipped."""
    at = 0
    while at < len(args):
        token = args[at]
        at += 1
        if not token.startswith("-") or token in ("-", "--"):
            continue
        name, equals, value = token.lstrip("-").partition("=")
        if equals:
            yield name, value
            continue
        opt = _BY_FLAG.get(name)
        takes_value = not opt.is_bool_flag if opt is not None else at < len(args) and not args[at].startswith("-")
        if takes_value and at < len(args):
            yield name, args[at]
            at += 1
        else:
            yield name, None


def _judge(opt: Option, value: str | None, said: str) -> Finding | None:
    if not opt.implemented:
        return warning(CHECK, f"{said}: tfusion declares it but does not implement it, and exits 1 when it is set",
                       "leave it out when switching")
    if value is None:
        return None
    try:
        opt.parse(value)
    except ValueError as exc:
        return warning(CHECK, f"{said}: tfusion refuses the value ({exc})", "change the value when switching")
    return None


def flag_findings(args: Sequence[str]) -> list[Finding]:
    findings = []
    for name, value in parse_go_flags(args):
        said = f"flag -{name}" + (f"={value}" if value is not None else "")
        opt = _BY_FLAG.get(name)
        if opt is None:
            findings.append(warning(CHECK, f"{said}: tfusion has no such flag (it would refuse to start with it)",
                                    "leave it out when switching; `tfusion --help` lists tfusion's flags"))
        elif (found := _judge(opt, value, said) or difference_finding(
                CHECK, said, f"-{name}", "true" if value is None else value)) is not None:
            findings.append(found)
    return findings


def env_findings(env: Sequence[Mapping[str, object]]) -> list[Finding]:
    findings = []
    for variable in env:
        name = text(variable, "name")
        literal = variable.get("value")
        value = literal if isinstance(literal, str) else None  # valueFrom: not readable here
        opt = _BY_ENV.get(name)
        if opt is None:
            if name and not name.startswith(_NOT_SETTINGS):
                findings.append(warning(CHECK, f"environment variable {name}: tfusion does not read it, so it has "
                                               "no effect there", "check the reference of tfusion's settings for "
                                                                  "its counterpart, if any"))
            continue
        said = f"environment variable {name}"
        found = _load_env(name, value) if value is not None else _judge(opt, None, said)
        found = found or difference_finding(CHECK, said + (f"={value!r}" if value is not None else ""), name, value)
        if found is not None:
            findings.append(found)
    return findings


def _load_env(name: str, value: str) -> Finding | None:
    try:
        Settings.load({}, env={name: value}, roles=("controller",))
    except NotImplementedSettingError:
        return warning(CHECK, f"environment variable {name}: tfusion declares it but does not implement it, and "
                              "exits 1 when it is set", "unset it when switching")
    except SettingsError as exc:
        return warning(CHECK, f"tfusion refuses {exc}",
                       "change the value when switching")
    return None


def config_findings(where: str, document: str) -> list[Finding]:
    """The dynamic config (`config.yaml` of a mounted ConfigMap) as the controller would load it: refused
    as a whole, or taken with a finding for each key tfusion treats differently."""
    try:
        raw = yaml.safe_load(document)
        validate(raw)
    except (ValueError, yaml.YAMLError) as exc:
        return [warning(CHECK, f"dynamic config {where}: tfusion refuses it ({exc})",
                        "fix the value named; tfusion keeps its defaults while the file is refused")]
    keys: Mapping[str, object] = raw or {}
    found = (difference_finding(CHECK, f"dynamic config {where}, {key}", key, value) for key, value in keys.items())
    return [f for f in found if f is not None]


async def check(ctx: Context) -> list[Finding]:
    findings: list[Finding] = []
    found = 0
    for raw in await ctx.client.list(r.DEPLOYMENTS):
        deployment = Body(raw)
        containers = original_containers(raw)
        if not containers:
            continue
        found += 1
        where = f"Deployment {deployment.namespace}/{deployment.name}"
        settings = [*_container_findings(containers), *await _mounted_configs(ctx, deployment)]
        if not any(f.severity == "warning" for f in settings):
            settings.insert(0, ok(CHECK, "runs the original operator; tfusion takes all its settings"))
        own = [*(version_finding(CHECK, text(c, "image")) for c in containers), *settings]
        findings.extend(Finding(f.check, f.severity, f"{where}: {f.message}", f.fix) for f in own)
    return findings or ([] if found else [ok(CHECK, "no TensorFusion operator Deployment: nothing to compare")])


def _container_findings(containers: Sequence[Mapping[str, object]]) -> list[Finding]:
    findings = []
    for container in containers:
        args = [a for a in (*items(container, "command")[1:], *items(container, "args")) if isinstance(a, str)]
        findings += flag_findings(args) + env_findings(sequence_of_maps(container.get("env")))
    return findings


async def _mounted_configs(ctx: Context, deployment: Body) -> list[Finding]:
    findings = []
    volumes = sequence_of_maps(section(deployment.spec, "template", "spec").get("volumes"))
    for name in (text(v, "configMap", "name") for v in volumes if text(v, "configMap", "name")):
        try:
            config_map = await ctx.client.get(r.CONFIGMAPS, name, namespace=deployment.namespace)
        except NotFound:
            continue
        document = text(config_map, "data", "config.yaml")
        if document:
            findings += config_findings(f"ConfigMap {deployment.namespace}/{name} config.yaml", document)
    return findings
