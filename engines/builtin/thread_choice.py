"""How many threads a small step runs on: one, or all of torch's, whichever has been faster lately.

A fused decode step (fused_decode.py) splits each of its ~150 matmuls and attention calls over torch's
OpenMP threads, and each ends at a barrier where the threads wait for the slowest. On an idle 2-core
machine two threads take SmolLM2's batch-1 step from ~8.8 to ~5.8 ms; on a busy one a thread that loses
its core stalls every barrier, and the same step took 26-69 ms while one thread kept its 8.8 (load ~2,
2026-11-26). So the runner times its steps and runs the option with the lower median time per row over
its last `WINDOW` steps: one slow step (a preemption) does not move a median, a machine that fills up does
within a few steps. Now and then it tries the other option once (a probe), so it notices when the machine
quietens or fills again: the first probe `MIN_PROBE_GAP` steps after a switch, then twice as long after
each probe that loses, up to `PROBE_EVERY`. A switch that a passing burst of load caused is undone within
a few steps, and on a machine that stays busy a probe costs one slow step in PROBE_EVERY.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class ThreadChoice:
    """Picks 1 or `max_threads` threads per step from the steps' measured times (`record`)."""

    max_threads: int
    recent_ms_per_row: dict[int, deque[float]] = field(default_factory=dict)  # per option: its last wall ms per row
    in_use: int | None = None
    probe_gap: int = 0  # steps between the last switch or probe and the next probe
    num_steps: int = 0  # since the last switch or probe

    WINDOW = 5  # steps whose median is an option's time
    MIN_PROBE_GAP = 4
    PROBE_EVERY = 64  # the longest gap between tries of the option not in use

    def pick(self) -> int:
        """The thread count for the next step."""
        options = (self.max_threads, 1)
        untried = [n for n in options if n not in self.recent_ms_per_row]
        if untried:
            return untried[0]
        best = min(options, key=self.ms_per_row)
        if best != self.in_use:
            self.in_use, self.probe_gap, self.num_steps = best, self.MIN_PROBE_GAP, 0
        self.num_steps += 1
        if self.num_steps > self.probe_gap:
            self.probe_gap, self.num_steps = min(2 * self.probe_gap, self.PROBE_EVERY), 0
            return 1 if best != 1 else self.max_threads
        return best

    def ms_per_row(self, num_threads: int) -> float:
        """The option's recent wall ms per row: the median of its last WINDOW steps."""
        return statistics.median(self.recent_ms_per_row[num_threads])

    def record(self, num_threads: int, wall_ms: float, num_rows: int) -> None:
        """A step's wall time on `num_threads`: one more of the option in use's, or a probed one's only time."""
        per_row = wall_ms / num_rows
        recent = self.recent_ms_per_row.get(num_threads)
        if recent is None or num_threads != self.in_use:  # untried, or a probe: what it takes now
            self.recent_ms_per_row[num_threads] = deque([per_row], maxlen=self.WINDOW)
        else:
            recent.append(per_row)
