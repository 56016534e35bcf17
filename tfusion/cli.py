"""Command line: flags -> Settings -> roles; nothing else.

`tfusion --role=<roles>` runs one or more roles in this process; `tfusion crds` prints the CRDs.
Bad input exits 2 with one line that names the flag or value; a role that cannot start exits 1, and so
does a setting that is valid but not implemented yet (naming it), so nothing is accepted and ignored.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from tfusion import __version__
from tfusion.api.durations import format_duration
from tfusion.console.target import OneLineParser
from tfusion.settings import (
    ALL_ROLES,
    OPTIONS,
    ROLES,
    NotImplementedSettingError,
    Option,
    Settings,
    SettingsError,
    not_implemented_options,
    parse_duration,
)

PROG = "tfusion"


def parse_roles(text: str) -> tuple[str, ...]:
    roles = tuple(part.strip() for part in text.split(",") if part.strip())
    if not roles:
        raise argparse.ArgumentTypeError("expected at least one role")
    for role in roles:
        if role not in ALL_ROLES:
            raise argparse.ArgumentTypeError(
                f"unknown role {role!r}; expected {', '.join(ALL_ROLES)} or a comma list of them")
    return roles


def _flag_type(opt: Option) -> Any:
    if not opt.implemented:  # any value is refused by Settings.load as not implemented (exit 1), not as bad
        return str

    def convert(text: str) -> Any:
        try:
            return opt.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = opt.attr
    return convert


def _describe_default(opt: Option) -> str:
    default = opt.default
    if isinstance(default, tuple):
        default = "-".join(str(part) for part in default)
    elif isinstance(default, bool):
        default = str(default).lower()
    elif isinstance(default, float) and opt.parse is parse_duration:
        default = format_duration(default)
    elif isinstance(default, float) and default.is_integer():
        default = int(default)
    text = f"{opt.help} (default: {default!s}" if default != "" else f"{opt.help} (default: unset"
    if opt.env:
        text += f"; env {opt.env}"
    text += ")"
    if not opt.implemented:
        text += " (not implemented yet)"
    return text


def _not_implemented_epilog() -> str:
    """Variables without a flag are not listed above, so the ones not implemented are named here."""
    # a flag is marked in its own help line
    names = [opt.env for opt in not_implemented_options() if opt.env and not opt.flag]
    if not names:
        return ""
    return f"Environment variables not implemented yet (setting one exits 1): {', '.join(names)}."


class _HelpFormatter(argparse.HelpFormatter):
    """Wraps help text between words only, so a default URL or path (with hyphens) stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def build_parser(roles: Sequence[str] | None) -> OneLineParser:
    """The parser for the given roles; None (no --role yet) shows every role's flags."""
    parser = OneLineParser(prog=PROG, description="GPU pooling and fractional virtual GPUs for Kubernetes.",
                           formatter_class=_HelpFormatter,
                     epilog="Other commands: 'tfusion crds [--out DIR]' prints or writes the CRDs. "
                            + _not_implemented_epilog()
                            + " 'tfusion why [-n NAMESPACE] POD' says why a pod is not scheduled."
                            + " 'tfusion console' serves a read-only web console of the cluster."
                            + " 'tfusion state backup|restore FILE' saves or brings back --role=all's state."
                            + " 'tfusion doctor' checks an installation and says how to fix what is wrong.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--role", type=parse_roles, default=("all",),
                        help="roles to run: controller, hypervisor, apiserver, all, or a comma list (default: all)")
    parser.add_argument("--listen", default=None,
                        help="address of the single role's HTTP server (same as --apiserver-listen or "
                             "--controller-listen; default: that role's)")
    shown = set(ROLES) if roles is None or "all" in roles else set(roles)
    groups: dict[str, Any] = {"common": parser.add_argument_group("common")}
    groups.update({role: parser.add_argument_group(role) for role in ROLES if role in shown})
    for opt in OPTIONS:
        if opt.flag is None:
            continue
        # Flags of roles not shown still parse (a shared command line may carry them) but stay out of --help.
        container = groups.get(opt.role, parser)
        kwargs: dict[str, Any] = {
            "dest": opt.attr, "default": None, "type": _flag_type(opt),
            "help": _describe_default(opt) if opt.role in groups else argparse.SUPPRESS,
        }
        if opt.is_bool_flag:
            kwargs.update(nargs="?", const=True, metavar="BOOL")
        container.add_argument(opt.flag, **kwargs)
    return parser


def _pre_parse_roles(argv: Sequence[str]) -> tuple[str, ...] | None:
    pre = OneLineParser(prog=PROG, add_help=False)
    pre.add_argument("--role", type=parse_roles, default=None)
    known, _ = pre.parse_known_args(list(argv))
    return known.role  # type: ignore[no-any-return]


def settings_from_args(argv: Sequence[str]) -> Settings:
    roles = _pre_parse_roles(argv)
    parser = build_parser(roles)
    args = parser.parse_args(list(argv))
    roles = args.role
    flags = {opt.attr: getattr(args, opt.attr, None) for opt in OPTIONS if opt.flag}
    if args.listen is not None:
        primary = [r for r in roles if r in ("apiserver", "controller")]
        if len(primary) != 1 or "all" in roles:
            parser.error("--listen is ambiguous with these roles; use --apiserver-listen or --controller-listen")
        flags[f"{primary[0]}_listen"] = args.listen
    try:
        return Settings.load(flags, roles=roles)
    except NotImplementedSettingError:
        raise  # valid but not built: main exits 1, not 2
    except SettingsError as exc:
        parser.error(str(exc))


def _crds_command(argv: Sequence[str]) -> int:
    parser = OneLineParser(prog=f"{PROG} crds",
                           description="Print all CRDs as one YAML stream, or write one file per kind.")
    parser.add_argument("--out", default=None, help="directory for one tensor-fusion.ai_<plural>.yaml per kind")
    args = parser.parse_args(list(argv))
    from tfusion.api import crds

    if args.out:
        for path in crds.write_crds(args.out):
            print(path)
    else:
        sys.stdout.write(crds.crds_yaml())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "crds":
        return _crds_command(argv[1:])
    if argv and argv[0] == "why":
        from tfusion.why import why_command

        return why_command(argv[1:])
    if argv and argv[0] == "state":
        from tfusion.embedded.statecli import state_command

        return state_command(argv[1:])
    if argv and argv[0] == "console":
        from tfusion.console.cli import console_command

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return console_command(argv[1:])
    if argv and argv[0] == "doctor":
        from tfusion.doctor.cli import doctor_command

        return doctor_command(argv[1:])
    try:
        settings = settings_from_args(argv)
    except NotImplementedSettingError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    from tfusion.api import annotations as ann

    try:  # every label/annotation key follows TENSOR_FUSION_CUSTOM_DOMAIN_PREFIX/_SUFFIX
        ann.set_domain(settings.domain_prefix, settings.domain_suffix)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level={"trace": 5, "debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING,
               "error": logging.ERROR}[settings.log_level],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.log_level not in ("trace", "debug"):  # httpx logs every API request at INFO
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from tfusion.api.documents import young_threshold_raised
    from tfusion.errors import RoleError
    from tfusion.roles import run

    try:
        with young_threshold_raised():
            return run(settings)
    except RoleError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
