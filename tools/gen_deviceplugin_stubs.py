"""Generate the kubelet API message classes from proto/deviceplugin.proto and proto/podresources.proto.

    .venv/bin/python tools/gen_deviceplugin_stubs.py          # rewrite the committed files
    .venv/bin/python tools/gen_deviceplugin_stubs.py --check  # exit 1 if they are out of date

Each proto/NAME.proto becomes tfusion/hypervisor/deviceplugin/NAME_pb2.py and NAME_pb2.pyi.

Why a script: the generated `_pb2.py` files (messages) and `_pb2.pyi` files (their types, for
mypy --strict) are committed, so installing tfusion needs only the `protobuf` runtime, not the code
generator (grpcio-tools, a dev dependency). The gRPC services are bound by hand from the generated
files' service descriptors (`tfusion/hypervisor/deviceplugin/rpc.py` for the device-plugin API,
`podresources.py` for the PodResources one), which keeps them typed; no `_pb2_grpc.py` is generated.
The test suite runs `--check`, so the committed files never drift from the .proto files.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTOS = ("deviceplugin.proto", "podresources.proto")
OUT_DIR = ROOT / "tfusion" / "hypervisor" / "deviceplugin"
OUTPUTS = tuple(f"{Path(proto).stem}_pb2{suffix}" for proto in PROTOS for suffix in (".py", ".pyi"))


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # the generator, a dev dependency

    for proto in PROTOS:
        code = protoc.main(["grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}",
                            f"--pyi_out={out_dir}", str(PROTO_DIR / proto)])
        if code != 0:
            raise SystemExit(f"protoc failed on {PROTO_DIR / proto} (exit {code})")


def stale() -> list[str]:
    """The committed outputs that differ from what the .proto files generate now."""
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
