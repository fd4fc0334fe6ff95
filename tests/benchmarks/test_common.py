"""benchmarks/common.py: baseline and subject alternate, each side keeps its own rounds; a server's
process tree (vLLM's engine runs in children) is found whole and its memory summed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from benchmarks.common import descendants, interleave, rss_mb, tree_rss_mb


async def test_rounds_alternate_baseline_first() -> None:
    calls: list[str] = []

    async def side(name: str) -> str:
        calls.append(name)
        return f"{name}{len(calls)}"

    paired = await interleave(lambda: side("b"), lambda: side("s"), 3)
    assert calls == ["b", "s"] * 3
    assert paired.baseline == ["b1", "b3", "b5"] and paired.subject == ["s2", "s4", "s6"]


async def test_at_least_one_round() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(ValueError, match="at least 1"):
        await interleave(nothing, nothing, 0)


def test_a_process_tree_takes_in_grandchildren_and_their_memory() -> None:
    # a child that starts a grandchild holding 64 MiB, then waits on it
    grandchild = "b = bytearray(64 << 20); import time; time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])"])
    try:
        for _ in range(200):
            tree = descendants(child.pid)
            if len(tree) == 2 and tree_rss_mb(child.pid)[0] > rss_mb(child.pid) + 60:
                break
            time.sleep(0.05)
        assert tree[0] == child.pid and len(tree) == 2
        now, peak = tree_rss_mb(child.pid)
        assert now > rss_mb(child.pid) + 60 and peak >= now
        assert os.getpid() not in tree
    finally:
        for pid in reversed(descendants(child.pid)):
            os.kill(pid, 9)
        child.wait()
