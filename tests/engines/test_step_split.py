from __future__ import annotations

import threading

import pytest
import torch

from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.builtin.runner.step_split import StepWorkers, plan_parts


def test_parts_balance_tokens_and_keep_item_order() -> None:
    parts = plan_parts([128, 1, 128, 1, 128, 124, 1, 1], 2)
    assert parts is not None
    assert sorted(i for part in parts for i in part) == list(range(8))
    assert all(part == sorted(part) for part in parts)
    loads = [sum([128, 1, 128, 1, 128, 124, 1, 1][i] for i in part) for part in parts]
    assert max(loads) - min(loads) <= 4


def test_sixteen_decodes_split_in_halves() -> None:
    assert plan_parts([1] * 16, 2) == [list(range(0, 16, 2)), list(range(1, 16, 2))]


def test_a_step_that_does_not_split_evenly_runs_whole() -> None:
    assert plan_parts([500, 1, 1, 1], 2) is None  # the chunk would run on one thread while the other idles
    assert plan_parts([7], 2) is None
    assert plan_parts([1, 1], 1) is None


def test_more_workers_than_items_uses_one_part_per_item() -> None:
    assert plan_parts([4, 4], 4) == [[0], [1]]


def test_parts_have_at_least_a_few_tokens() -> None:
    assert plan_parts([1, 1, 1], 2) is None  # three decode rows run whole
    assert plan_parts([1] * 16, 16) == [list(range(i, 16, 4)) for i in range(4)]  # 4 parts of 4 rows, not 16 of 1


def test_workers_run_with_one_torch_thread_and_leave_the_callers_count() -> None:
    before = torch.get_num_threads()
    workers = StepWorkers(2)
    try:
        counts = workers.map(lambda _: (torch.get_num_threads(), threading.current_thread().name), [0, 1])
        assert [count for count, _ in counts] == [1, 1]
        assert all(name.startswith("edgerun-step-") for _, name in counts)
        assert torch.get_num_threads() == before
    finally:
        workers.close()


def test_an_error_in_one_part_reaches_the_caller_after_every_part_ends() -> None:
    workers = StepWorkers(2)
    finished = threading.Event()

    def part(n: int) -> int:
        if n == 0:
            raise ValueError("part 0 failed")
        finished.wait(5)  # still running when part 0 fails
        return n

    try:
        threading.Timer(0.2, finished.set).start()
        with pytest.raises(ValueError, match="part 0 failed"):
            workers.map(part, [0, 1])
        assert finished.is_set()
    finally:
        workers.close()


def test_step_workers_are_validated() -> None:
    with pytest.raises(ValueError, match="step_workers"):
        EngineConfig(step_workers=0)


def test_a_split_step_gives_the_logits_and_hidden_states_of_a_whole_one() -> None:
    runners = [ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32", step_workers=n))
               for n in (1, 2)]
    assert runners[0].step_workers is None and runners[1].step_workers is not None
    assert runners[1].step_workers.threads == []  # started by the first split step, not by the load
    prompts = [list(range(1, n)) for n in (9, 30, 17, 21)]
    outputs = []
    for runner in runners:
        tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(prompts))]
        runner.execute([ForwardItem(p, 0, t) for p, t in zip(prompts[:3], tables)])
        items = [
            ForwardItem([40], len(prompts[0]), tables[0]),  # a decode
            ForwardItem(prompts[3], 0, tables[3]),  # a prefill
            ForwardItem([41, 42, 43], len(prompts[1]), tables[1], num_logits=3),  # a verify row
            ForwardItem([44], len(prompts[2]), tables[2]),
        ]
        outputs.append(runner.run(items, aux_layers=(0,)))
    whole, split = outputs
    assert split.logits.shape == whole.logits.shape == (6, runners[0].model_config.vocab_size)
    torch.testing.assert_close(split.logits, whole.logits, atol=1e-5, rtol=1e-5)
    assert whole.hidden is not None and split.hidden is not None
    assert [h.shape for h in split.hidden] == [h.shape for h in whole.hidden]
    for a, b in zip(split.hidden, whole.hidden):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    started = runners[1].step_workers.threads
    assert len(started) == 2 and all(t.is_alive() for t in started)
    runners[1].close()
    for thread in started:
        thread.join(timeout=10)
        assert not thread.is_alive()
