"""How many threads a small step runs on: one, or all of torch's, whichever has been faster lately.

A fused decode step (fused_decode.py) splits each of its ~150 matmuls and attention calls over torch's
OpenMP threads, and each ends at a barrier where the threads wait for the slowest. On an idle 2-core
machine two threads take SmolLM2's batch-1 step from ~8.8 to ~5.8 ms; on a busy one a thread that loses
its core stalls every barrier, and the same step took 26-69 ms while one thread kept its 8.8 (load ~2,
2026-11-26). So the runner times its steps: it runs the option with the lower recent time per row, and
every `PROBE_EVERY` steps tries the other once, so it notices when the machine quietens or fills again.
A probe on a busy machine costs one slow step in PROBE_EVERY. One slow step is enough to switch, and on a
quiet machine a step that another process preempted once would then hold a stream on one thread until the
next probe (served, a whole 64-token stream at ~108 tok/s instead of ~165): so a switch after the choice
has held for PROBE_EVERY steps is followed by a probe `QUICK_PROBE` steps later, which undoes it if the
slowness has passed. Switches closer together (a machine whose load comes and goes) get no quick probe,
so those cost at most one more probe per PROBE_EVERY steps.

Steps of different sizes are not compared: the time per row falls as a step grows, and not alike on one
thread and on all (a speculative verify row of 9 tokens costs ~4.5x a decode on one thread, ~7x on two
busy ones), so a probe that happened to run a big step would make its option look faster for the decodes
too. `ThreadChoices` keeps one choice per size class: single decodes, and then each further pass of the
matmul kernels over their weights (`rows_per_pass` rows each).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ThreadChoice:
    """Picks 1 or `max_threads` threads per step from the steps' measured times (`record`)."""

    max_threads: int
    ms_per_row: dict[int, float] = field(default_factory=dict)  # per option: recent wall ms per row
    num_steps: int = 0
    in_use: int | None = None
    switched_at: int = 0  # num_steps at the last change of the option in use
    quick_probe_at: int | None = None  # num_steps of the probe that follows a switch, if any

    PROBE_EVERY = 64  # steps between tries of the option not in use
    QUICK_PROBE = 4  # steps from a switch to its probe
    SMOOTHING = 0.25  # weight of a new time in the option in use's running average

    def pick(self) -> int:
        """The thread count for the next step."""
        options = (self.max_threads, 1)
        untried = [n for n in options if n not in self.ms_per_row]
        if untried:
            return untried[0]
        best = min(options, key=self.ms_per_row.__getitem__)
        self.num_steps += 1
        if best != self.in_use:
            held = self.in_use is not None and self.num_steps - self.switched_at >= self.PROBE_EVERY
            self.quick_probe_at = self.num_steps + self.QUICK_PROBE if held else None
            self.in_use, self.switched_at = best, self.num_steps
        if self.num_steps % self.PROBE_EVERY == 0 or self.num_steps == self.quick_probe_at:
            return 1 if best != 1 else self.max_threads
        return best

    def record(self, num_threads: int, wall_ms: float, num_rows: int) -> None:
        """A step's wall time on `num_threads`: averaged into the faster option's (the one in use), or replacing
        the slower one's (a probe, so a single time decides whether it has become the faster)."""
        per_row = wall_ms / num_rows
        known = self.ms_per_row.get(num_threads)
        is_fastest = known is not None and known <= min(self.ms_per_row.values())
        if known is None or not is_fastest:
            self.ms_per_row[num_threads] = per_row
        else:
            self.ms_per_row[num_threads] = known + self.SMOOTHING * (per_row - known)


@dataclass(slots=True)
class ThreadChoices:
    """One `ThreadChoice` per step size class: 1 row, then 1, 2, ... passes of `rows_per_pass` rows."""

    max_threads: int
    rows_per_pass: int
    by_class: dict[int, ThreadChoice] = field(default_factory=dict)

    def _choice(self, num_rows: int) -> ThreadChoice:
        size_class = 0 if num_rows == 1 else -(-num_rows // self.rows_per_pass)
        choice = self.by_class.get(size_class)
        if choice is None:
            choice = self.by_class[size_class] = ThreadChoice(self.max_threads)
        return choice

    def pick(self, num_rows: int) -> int:
        """The thread count for a step of `num_rows` rows."""
        return self._choice(num_rows).pick()

    def record(self, num_threads: int, wall_ms: float, num_rows: int) -> None:
        """A step's wall time, for the choice of its size class."""
        self._choice(num_rows).record(num_threads, wall_ms, num_rows)
