"""`python -m tests.fake_cuda DIR`: a GPU box for trying the soft limiter on a machine without one.

Builds the tests' fakes of the hardware into DIR (the CUDA driver `libcuda.so.1`, NVML
`libnvidia-ml.so.1`, both driven by one simulated busy-time clock, and the probe program) and prints
the `export` lines a shell evaluates so that a hypervisor started from it (`--devices=nvml`) and the
local workers it starts see one simulated A100. The docs' "Soft limits in a real process"
(docs/getting-started.md) runs it.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tests import fake_nvml
from tests.fake_cuda import build_fakes

#: busy time of one launched thread on the simulated device: a 1-thread launch keeps it busy 100 µs
NS_PER_THREAD = 100_000


def exports(root: Path, driver: Path, nvml: Path, probe: Path) -> list[str]:
    values = {"FAKE_NVML_GPU_COUNT": "1", "FAKE_GPU_BUSY_CLOCK": str(root / "busy-clock"),
              "FAKE_CUDA_UUIDS": fake_nvml.GPU0_UUID, "FAKE_CUDA_NS_PER_THREAD": str(NS_PER_THREAD),
              "PROBE": str(probe)}
    lines = [f"export {key}={shlex.quote(value)}" for key, value in values.items()]
    path = f"{shlex.quote(str(nvml.parent))}:{shlex.quote(str(driver.parent))}"
    lines.append(f'export LD_LIBRARY_PATH={path}"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"')
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.fake_cuda DIR", file=sys.stderr)
        return 2
    root = Path(argv[0]).resolve()
    root.mkdir(parents=True, exist_ok=True)
    driver, _, probe = build_fakes(root / "cuda")
    nvml = fake_nvml.build(root / "nvml")
    print("\n".join(exports(root, driver, nvml, probe)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
