"""The name issue 16 gives the gateway overhead benchmark: `python -m gateway.bench_overhead [options]`
runs `python -m benchmarks.gateway_overhead` with the same options (its docstring says what they do).

Only an alias: nothing in the gateway imports it, and it imports the benchmark only when run, so the
gateway package does not depend on the benchmarks.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("benchmarks.gateway_overhead", run_name="__main__", alter_sys=True)
