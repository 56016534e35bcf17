"""`python -m tests.fake_nvml OUT_DIR`: build the fake libnvidia-ml.so.1 into OUT_DIR and print how to use it,
e.g. `LD_LIBRARY_PATH=OUT_DIR tfusion --role=hypervisor --backend=local --devices=nvml`."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.fake_nvml import build

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.fake_nvml OUT_DIR")
    lib = build(Path(sys.argv[1]))
    print(f"built {lib}; use it with LD_LIBRARY_PATH={lib.parent}")
