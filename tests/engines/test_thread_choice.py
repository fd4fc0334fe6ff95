"""The fused step's thread count policy (engines/builtin/thread_choice.py), fed step times directly."""

from __future__ import annotations

from engines.builtin.thread_choice import ThreadChoice


def run_steps(choice: ThreadChoice, ms_per_step: dict[int, float], num_steps: int) -> list[int]:
    picked = []
    for _ in range(num_steps):
        n = choice.pick()
        choice.record(n, ms_per_step[n], num_rows=1)
        picked.append(n)
    return picked


def test_it_tries_both_then_keeps_the_faster_and_probes_the_other_ever_more_rarely() -> None:
    choice = ThreadChoice(max_threads=2)
    picked = run_steps(choice, {1: 8.8, 2: 5.8}, 2 + 300)
    assert picked[:2] == [2, 1]
    probes = [i for i, n in enumerate(picked) if n == 1 and i >= 2]
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]
    assert gaps[:4] == [8, 16, 32, 64] and set(gaps[4:]) == {ThreadChoice.PROBE_EVERY}


def test_one_slow_step_does_not_switch_but_a_busy_machine_does() -> None:
    choice = ThreadChoice(max_threads=2)
    run_steps(choice, {1: 8.8, 2: 5.8}, 10)
    choice.record(2, 40.0, num_rows=1)  # one preempted step
    assert choice.pick() == 2 and choice.in_use == 2
    choice.record(2, 5.8, num_rows=1)
    for _ in range(2):
        choice.record(2, 40.0, num_rows=1)
    assert choice.in_use == 2
    choice.record(2, 40.0, num_rows=1)  # 3 of the last 5 slow: the machine is busy
    assert choice.pick() == 1 and choice.in_use == 1


def test_a_switch_that_passing_load_caused_is_undone_at_the_first_probe() -> None:
    choice = ThreadChoice(max_threads=2)
    run_steps(choice, {1: 8.8, 2: 5.8}, 10)
    run_steps(choice, {1: 8.8, 2: 40.0}, 3)  # a burst of load: on one thread now
    quiet = run_steps(choice, {1: 8.8, 2: 5.8}, 20)
    first_two = quiet.index(2)
    assert first_two <= ThreadChoice.MIN_PROBE_GAP + 1  # not PROBE_EVERY steps on one thread
    assert choice.in_use == 2 and quiet[first_two:].count(1) == 2  # back on 2, probing 1 at gaps of 4, 8


def test_on_a_machine_that_stays_busy_probes_thin_out() -> None:
    choice = ThreadChoice(max_threads=2)
    picked = run_steps(choice, {1: 8.8, 2: 40.0}, 2 + 4 * ThreadChoice.PROBE_EVERY)
    assert picked[2:].count(2) <= 7 and picked[-ThreadChoice.PROBE_EVERY:].count(2) == 1


def test_times_are_compared_per_row() -> None:
    choice = ThreadChoice(max_threads=4)
    choice.record(4, 12.0, num_rows=4)  # 3 ms per row
    choice.record(1, 5.0, num_rows=1)
    assert choice.pick() == 4
