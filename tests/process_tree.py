"""A gateway supervisor's processes, read from Linux /proc: which workers it started,
and what each runs. The `serve --workers` and `dev` tests and benchmarks/gateway/workers.py use them."""

from __future__ import annotations

from pathlib import Path


def gateway_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children (the workers), or the process itself for a lone gateway."""
    children = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split()
    return [int(pid) for pid in children] or [supervisor_pid]


def command_lines(pids: list[int]) -> dict[int, list[bytes]]:
    """pid -> its command line's arguments (empty for a process that has exited)."""
    return {pid: Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in pids}

