"""The region's KV pool master (`mooncake_master`, from the `mooncake-transfer-engine-non-cuda`
package, extra "kv") as a child process, and the backend flags that join it.

`edgerun dev --backends N` starts one master and N built-in backends that share its pool; tests
and benchmarks start them the same way.
"""

from __future__ import annotations

import shutil
import socket
import sys
from pathlib import Path

from cli.processes import ChildProcess, ProcessError, free_port

DEV_HOST_TIER_BLOCKS = 1024  # per backend: 1,024 x 16 tokens (0.75 GB of SmolLM2's float32 KV)
DEV_SEGMENT_MB = 1024  # what each backend lends the pool


def master_binary() -> str:
    """mooncake_master beside this Python (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "mooncake_master"
    found = str(beside) if beside.exists() else shutil.which("mooncake_master")
    if found is None:
        raise ProcessError("mooncake_master is not installed: pip install -e '.[kv]' (make installs it)")
    return found


def spawn_master(port: int | None = None, *, inherit_output: bool = False) -> ChildProcess:
    """`mooncake_master` on `port` (None: a free one), ready: its RPC port accepts connections."""
    port = port or free_port()
    argv = [master_binary(), f"--rpc_port={port}", f"--metrics_port={free_port()}", "--rpc_address=127.0.0.1"]
    master = ChildProcess.launch("the KV pool master", argv, port, inherit_output=inherit_output)
    master.wait_until_ready(lambda: _accepts(port), timeout_s=30.0, interval_s=0.1)
    return master


def pool_flags(master: ChildProcess, host_tier_blocks: int = DEV_HOST_TIER_BLOCKS,
               segment_mb: int = DEV_SEGMENT_MB) -> list[str]:
    """`edgerun backend` flags that put a backend in `master`'s pool (loopback: a trusted network)."""
    return ["--host-tier-blocks", str(host_tier_blocks), "--kv-region-pool", f"127.0.0.1:{master.port}",
            "--kv-region-pool-segment-mb", str(segment_mb), "--kv-mooncake-trusted-network"]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
