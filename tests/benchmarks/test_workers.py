"""benchmarks/workers.py: the CPU of `edgerun serve --workers N` is summed over the supervisor's
children, found through /proc; a lone process counts itself."""

from __future__ import annotations

import os
import subprocess
import sys

from benchmarks.workers import worker_pids


def test_worker_pids_are_the_children_or_the_process_itself() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in worker_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert worker_pids(lone.pid) == [lone.pid]
    finally:
        lone.kill()
        lone.wait()
