"""`tfusion doctor [--kube K] [-o json] [--operator-namespace NS] [--hypervisor-port P]`.

Prints each finding with its fix (`-o json`: `{findings: [{check, severity, message, fix}],
summary}`). Exit codes: 0 no error (warnings and info allowed), 1 an error was found or the API server
cannot be used, 2 bad arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio

from tfusion.console.target import OneLineParser, kube_target
from tfusion.doctor.context import Context
from tfusion.doctor.findings import exit_code, render_json, render_text
from tfusion.doctor.run import run_checks
from tfusion.settings import Settings

PROG = "tfusion doctor"


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog=PROG, description="Check a tfusion installation and say how to fix what is wrong.")
    parser.add_argument("--kube", default="", help="API server: a kubeconfig path, 'in-cluster' or 'embedded' "
                                                   "(default: $KUBECONFIG, else in-cluster)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="text (default) or json")
    parser.add_argument("--operator-namespace", default="",
                        help="tfusion's namespace (default: $OPERATOR_NAMESPACE, else tensor-fusion-sys)")
    parser.add_argument("--hypervisor-port", type=_port, default=None,
                        help="the port hypervisors serve on, asked where none runs as a pod (default: "
                             "$HYPERVISOR_PORT, else 8001)")
    return parser


def _port(text: str) -> int:
    import argparse

    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port; expected 1..65535")
    return int(text)


def doctor_command(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:  # the environment's OPERATOR_NAMESPACE, HYPERVISOR_PORT and KUBECONFIG, as the roles read them
        defaults = Settings.load({}, roles=("controller", "hypervisor"))
        target = kube_target(args.kube)
    except ValueError as exc:
        parser.error(str(exc))
    namespace = args.operator_namespace or defaults.operator_namespace
    port = args.hypervisor_port or defaults.hypervisor_port
    return anyio.run(_run, target, namespace, port, args.output)


async def _run(target: str, namespace: str, port: int, output: str) -> int:
    from tfusion.kube.client import KubeClient, KubeError

    try:
        client = await KubeClient.connect(target, qps=200.0, burst=200)
    except (KubeError, ValueError) as exc:
        print(f"{PROG}: cannot use the API server: {exc}", file=sys.stderr)
        return 1
    try:
        findings = await run_checks(Context(client, namespace, port))
    finally:
        await client.close()
    sys.stdout.write(render_json(findings) if output == "json" else render_text(findings))
    return exit_code(findings)
