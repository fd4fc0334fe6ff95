"""What every benchmark report states about where it ran, and CPU time read from another process."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    return stat_cpu_s(Path(f"/proc/{pid}/stat"))


def stat_cpu_s(stat: Path) -> float:
    """User + system CPU seconds in a /proc `stat` file: a process's, or one thread's (`task/<tid>/stat`)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
