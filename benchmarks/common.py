"""What every benchmark shares: where it ran, CPU time read from a process, baseline and subject interleaved.

    machine()        one line every report states: CPU, cores, Python, OS (and torch, with its GPU)
    process_cpu_s()  user + system CPU seconds of a process, or of one thread (stat_cpu_s)
    rss_mb()         a process's resident memory now
    tree_rss_mb()    the same summed over a process and its descendants, now and at peak
    interleave()     baseline and subject measured in one run, in alternating rounds

A shared machine's speed drifts with its neighbours' load, so a baseline measured a minute before
its subject is not a fair comparison. Every benchmark that compares two things calls `interleave`:
each round runs the baseline, then the subject, and the caller summarises the rounds of each side
(median, sum or pooled percentiles) knowing both saw the same machine.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(with_torch: bool = False) -> str:
    """One line: CPU, core count, Python and OS (and torch, with its GPU if any, when asked)."""
    text = f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} {platform.release()}"
    if with_torch:
        import torch

        text += f", torch {torch.__version__}"
        if torch.cuda.is_available():
            text += f", {torch.cuda.get_device_name(0)}"
    return text


def rss_mb(pid: int) -> float:
    """A process's resident memory now, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        found.append(todo.pop())
        todo.extend(children.get(found[-1], []))
    return found


def tree_rss_mb(pid: int) -> tuple[float, float]:
    """Resident memory of `pid` and its descendants in MiB, summed: (now, each one's peak). Pages two
    of them share count twice."""
    now = peak = 0.0
    for member in descendants(pid):
        try:
            lines = Path(f"/proc/{member}/status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("VmRSS:"):
                now += int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak += int(line.split()[1]) / 1024
    return now, peak


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds in a /proc `stat` file: a process's, or one thread's (`task/<tid>/stat`)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(slots=True)
class Paired(Generic[T]):
    """Each side's result per round, in round order."""

    baseline: list[T]
    subject: list[T]


async def interleave(
    baseline: Callable[[], Awaitable[T]], subject: Callable[[], Awaitable[T]], rounds: int
) -> Paired[T]:
    """`rounds` times: one baseline measurement, then one subject measurement."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    paired: Paired[T] = Paired([], [])
    for _ in range(rounds):
        paired.baseline.append(await baseline())
        paired.subject.append(await subject())
    return paired
