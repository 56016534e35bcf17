"""Generate the device-plugin message classes from proto/deviceplugin.proto.

    .venv/bin/python tools/gen_deviceplugin_stubs.py          # rewrite the committed files
    .venv/bin/python tools/gen_deviceplugin_stubs.py --check  # exit 1 if they are out of date

Why a script: the generated `deviceplugin_pb2.py` (messages) and `deviceplugin_pb2.pyi` (their types,
for mypy --strict) are committed, so installing tfusion needs only the `protobuf` runtime, not the
code generator (grpcio-tools, a dev dependency). The gRPC services are bound by hand in
`tfusion/hypervisor/deviceplugin/rpc.py` from the generated file's service descriptors, which keeps
them typed; no `_pb2_grpc.py` is generated. The test suite runs `--check`, so the committed files
never drift from the .proto.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTO = "deviceplugin.proto"
OUT_DIR = ROOT / "tfusion" / "hypervisor" / "deviceplugin"
OUTPUTS = ("deviceplugin_pb2.py", "deviceplugin_pb2.pyi")


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # the generator, a dev dependency

    code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                        str(PROTO_DIR / PROTO)])
    if code != 0:
        raise SystemExit(f"protoc failed on {PROTO_DIR / PROTO} (exit {code})")


def stale() -> list[str]:
    """The committed outputs that differ from what the .proto generates now."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        return [name for name in OUTPUTS
                if not (OUT_DIR / name).is_file() or not filecmp.cmp(Path(tmp) / name, OUT_DIR / name, shallow=False)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the committed files are current")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale()
        if outdated:
            print(f"out of date: {', '.join(outdated)}; run tools/gen_deviceplugin_stubs.py", file=sys.stderr)
            return 1
        return 0
    generate(OUT_DIR)
    print(f"wrote {', '.join(str(OUT_DIR / n) for n in OUTPUTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
