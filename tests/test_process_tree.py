"""tests/process_tree.py: a supervisor's processes are its children, found through /proc; a lone
process counts itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.process_tree import gateway_pids

pytestmark = pytest.mark.process


def test_gateway_pids_are_the_children_or_the_process_itself() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in gateway_pids(os.getpid())
    finally:
        child.kill()
        child.wait()
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert gateway_pids(lone.pid) == [lone.pid]
    finally:
        lone.kill()
        lone.wait()
