"""The fused step's thread count policy (engines/builtin/runner/thread_choice.py), fed step times directly."""

from __future__ import annotations

from collections.abc import Callable

from engines.builtin.runner.thread_choice import ThreadChoice, ThreadChoices


def run_steps(choice: ThreadChoice, ms_per_step: dict[int, float], num_steps: int) -> list[int]:
    picked = []
    for _ in range(num_steps):
        n = choice.pick()
        choice.record(n, ms_per_step[n], num_rows=1)
        picked.append(n)
    return picked


def test_it_tries_both_then_keeps_the_faster_and_probes_the_other_now_and_then() -> None:
    choice = ThreadChoice(max_threads=2)
    picked = run_steps(choice, {1: 8.8, 2: 5.8}, 2 + 2 * ThreadChoice.PROBE_EVERY)
    assert picked[:2] == [2, 1]
    assert picked[2:].count(1) == 2  # one probe per PROBE_EVERY steps
    assert picked[-1] == 1 and set(picked[2:-1]) == {2, 1}


def test_it_moves_to_one_thread_when_the_machine_fills_and_back_when_it_empties() -> None:
    choice = ThreadChoice(max_threads=2)
    run_steps(choice, {1: 8.8, 2: 5.8}, 10)
    busy = run_steps(choice, {1: 8.8, 2: 40.0}, 10)
    assert busy[0] == 2 and busy[1:] == [1] * 9  # one slow step is enough to switch
    quiet = run_steps(choice, {1: 8.8, 2: 5.8}, 2 * ThreadChoice.PROBE_EVERY)
    assert quiet[-1] == 2 and quiet.count(1) < ThreadChoice.PROBE_EVERY + 2  # back after the next probe


def test_after_a_long_hold_one_slow_step_is_undone_by_a_quick_probe() -> None:
    choice = ThreadChoice(max_threads=2)
    run_steps(choice, {1: 8.8, 2: 5.8}, 2 + ThreadChoice.PROBE_EVERY + 1)
    assert run_steps(choice, {1: 8.8, 2: 40.0}, 1) == [2]  # preempted once
    after = run_steps(choice, {1: 8.8, 2: 5.8}, 20)
    assert after[: ThreadChoice.QUICK_PROBE + 1] == [1] * ThreadChoice.QUICK_PROBE + [2]  # not PROBE_EVERY steps
    assert set(after[ThreadChoice.QUICK_PROBE :]) == {2}
    # switches that follow closely (load that comes and goes) get no quick probe: one thread until the next probe
    assert run_steps(choice, {1: 8.8, 2: 40.0}, 1) == [2]
    again = run_steps(choice, {1: 8.8, 2: 5.8}, 20)
    assert again == [1] * 20


def test_times_are_compared_per_row() -> None:
    choice = ThreadChoice(max_threads=4)
    choice.record(4, 12.0, num_rows=4)  # 3 ms per row
    choice.record(1, 5.0, num_rows=1)
    assert choice.pick() == 4


# A speculative stream's steps on a machine where one thread wins single decodes and two threads win big verify
# steps (wall ms by thread count): the kind of split BENCHMARKS.md "Speculative decoding" shows.
DECODE_MS = {1: 8.8, 2: 12.0}
VERIFY_9_MS = {1: 64.0, 2: 45.0}


def run_mixed(pick: Callable[[int], int], record: Callable[[int, float, int], None]) -> dict[int, list[int]]:
    """Three decodes, then a 9-token verify step, over and over: the thread counts picked, by step size."""
    picked: dict[int, list[int]] = {1: [], 9: []}
    for step in range(8 * ThreadChoice.PROBE_EVERY):
        rows = 9 if step % 4 == 3 else 1
        n = pick(rows)
        record(n, (VERIFY_9_MS if rows == 9 else DECODE_MS)[n], rows)
        picked[rows].append(n)
    return picked


def mostly(picked: list[int]) -> int:
    late = picked[len(picked) // 2 :]
    return max(set(late), key=late.count)


def test_steps_of_different_sizes_get_their_own_faster_thread_count() -> None:
    # One choice for all sizes gives both sizes the same thread count (probes aside): one of them always runs
    # on its slower option.
    single = ThreadChoice(max_threads=2)
    shared = run_mixed(lambda rows: single.pick(), single.record)
    assert mostly(shared[1]) == mostly(shared[9])
    choices = ThreadChoices(max_threads=2, rows_per_pass=4)
    apart = run_mixed(choices.pick, choices.record)
    assert (mostly(apart[1]), mostly(apart[9])) == (1, 2)
    late = apart[1][len(apart[1]) // 2 :]
    assert late.count(2) <= len(late) // ThreadChoice.PROBE_EVERY + 2  # decodes on two threads: probes only
    assert set(choices.by_class) == {0, 3}  # 1 row; 9 rows = three passes of 4
