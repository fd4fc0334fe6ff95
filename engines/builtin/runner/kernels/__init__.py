"""edgerun's own C++ CPU kernels, built once as a torch extension and registered as torch ops:
block_gemv.cpp (`torch.ops.edgerun.q4_1_linear`, `q8_0_linear`: Q4_1 and Q8_0 matmuls for any number of rows,
AVX2), decode_step.cpp (`torch.ops.edgerun.decode_step`: a whole decode step of a few rows in one call) and
paged_attention.cpp (`torch.ops.edgerun.paged_decode_attention`: single-token rows attending straight from
the paged KV cache, for the torch path's decode rows in the fast mode).

The build is cached under ~/.cache/edgerun/kernels/<hash of the sources, torch version and flags>, so
a machine compiles it once (the Makefile's install step does: `python -m engines.builtin.runner.kernels`);
later processes only load the shared library. Where the CPU lacks AVX2/FMA/F16C, the compiler is
missing, the build fails, or EDGERUN_KERNELS=off, `load()` returns False after one log line and the
engine keeps torch's own ops.

The kernels are AVX2 code on every x86 CPU; what differs on an AVX-512 one is the engine around them: steps
of more than a few rows run through torch's int4 op there (`config.int4_matmul_available`), through the kernels
themselves on AVX2-only CPUs (linear.BlockLinear). `ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2` (torch's and fbgemm's own
settings; the first is what that check reads) run an AVX-512 machine as an AVX2-only one, kernels and fallbacks alike,
to test or measure that configuration (BENCHMARKS.md, "4-bit kernels on AVX2").
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("block_gemv.cpp", "decode_step.cpp", "paged_attention.cpp")]
HEADERS = [Path(__file__).with_name("block_gemv.h")]
# -fopenmp: at::parallel_for is inline OpenMP in torch's headers, so without it every kernel ran on one thread.
# The library then needs libgomp.so.1, which the dynamic linker finds already loaded by torch (its own copy,
# same soname): one OpenMP runtime and one thread pool in the process, sized by torch.set_num_threads.
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fno-math-errno", "-fopenmp")
LDFLAGS = ("-fopenmp",)
NAME = "edgerun_kernels"
DISABLE_ENV = "EDGERUN_KERNELS"  # "off": never build or load them (the fallback path, on purpose)


def cpu_has_avx2() -> bool:
    """AVX2, FMA and F16C, as the kernel needs (Linux's /proc/cpuinfo; False where it cannot tell)."""
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return {"avx2", "fma", "f16c"} <= set(flags.split())


def build_dir() -> Path:
    import torch

    code = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    flags = " ".join(CFLAGS + LDFLAGS).encode()
    key = hashlib.sha256(code + torch.__version__.encode() + flags).hexdigest()[:16]
    return Path.home() / ".cache" / "edgerun" / "kernels" / f"{NAME}-{key}"


@functools.cache
def load() -> bool:
    """Whether the edgerun ops are registered in this process (building them if needed, once)."""
    if os.environ.get(DISABLE_ENV, "").lower() in ("off", "0", "false"):
        logger.info("edgerun kernels off (%s=%s): torch's own ops run instead", DISABLE_ENV, os.environ[DISABLE_ENV])
        return False
    if not cpu_has_avx2():
        logger.info("edgerun kernels need AVX2, FMA and F16C, which this CPU lacks: torch's own ops run instead")
        return False
    import torch

    directory = build_dir()
    library = directory / f"{NAME}.so"
    try:
        if library.exists():
            torch.ops.load_library(str(library))  # type: ignore[no-untyped-call]  # unannotated in torch
        else:
            from torch.utils.cpp_extension import load as build

            directory.mkdir(parents=True, exist_ok=True)
            logger.info("building the edgerun kernels in %s (once per machine)", directory)
            # copies: torch appends its own libraries to extra_ldflags, which would change build_dir()'s key
            build(NAME, [str(path) for path in SOURCES], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
                  build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as exc:  # no compiler, no ninja, a failed build: the engine must still start
        logger.warning("edgerun kernels unavailable (%s: %s); torch's own ops run instead",
                       type(exc).__name__, str(exc).strip().splitlines()[-1] if str(exc).strip() else "")
        return False
    return hasattr(torch.ops.edgerun, "q4_1_linear") and hasattr(torch.ops.edgerun, "decode_step")
