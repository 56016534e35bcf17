"""Builds the fake `libnvidia-ml.so.1` (fake_nvml.c) and points nvidia-ml-py at it.

Two ways in, both leaving pynvml's own ctypes code to do the work:
- `use_in_process(lib)`: pre-sets pynvml's library handle to the fake (what `_LoadNvmlLibrary`
  would have loaded) and clears its function-pointer cache; `restore` undoes it.
- `subprocess_env(lib)`: an environment whose LD_LIBRARY_PATH makes pynvml's
  `CDLL("libnvidia-ml.so.1")` find the fake in a child process.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from tests.cbuild import compile_c
from tests.cbuild import gcc as gcc  # re-exported: the callers ask it before building

SOURCE = Path(__file__).with_name("fake_nvml.c")
#: the file name pynvml looks for; the SONAME differs so that, once loaded in-process by path, the
#: fake is never what a later CDLL("libnvidia-ml.so.1") finds (glibc matches loaded objects by SONAME)
FILENAME = "libnvidia-ml.so.1"
SONAME = "libtfusion-fake-nvidia-ml.so.1"

#: what the fake reports, for assertions
GPU0_UUID = "GPU-5f3a1c2e-0000-4000-8000-000000000a00"
GPU1_UUID = "GPU-9b1d7e44-1111-4111-8111-000000000b01"


def build(out_dir: Path) -> Path:
    """Compile the fake into `out_dir/libnvidia-ml.so.1`; raises with the compiler's message."""
    return compile_c(SOURCE, out_dir / FILENAME, ["-shared", "-fPIC", f"-Wl,-soname,{SONAME}"], "the fake NVML")


def use_in_process(lib: Path) -> dict[str, Any]:
    import pynvml

    saved = {"lib": pynvml.nvmlLib, "cache": dict(pynvml._nvmlGetFunctionPointer_cache),
             "refcount": pynvml._nvmlLib_refcount}
    pynvml.nvmlLib = ctypes.CDLL(str(lib))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    return saved


def restore(saved: dict[str, Any]) -> None:
    import pynvml

    pynvml.nvmlLib = saved["lib"]
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlGetFunctionPointer_cache.update(saved["cache"])
    pynvml._nvmlLib_refcount = saved["refcount"]


def subprocess_env(lib: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib.parent), env.get("LD_LIBRARY_PATH", "")) if p)
    env.update(extra)
    return env
