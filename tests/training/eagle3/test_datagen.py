import json

import torch
from safetensors.torch import load_file

from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from training.eagle3.datagen import DataGenConfig, generate_data
from training.eagle3.dataset import read_conversations
from training.eagle3.features import target_logits
from training.eagle3.prompts import build_prompts, split


def test_shards_hold_greedy_answers_and_the_hidden_states_that_made_them(tmp_path):
    engine = LLMEngine(EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32"))
    prompts = build_prompts()[:3]
    config = DataGenConfig(tmp_path, aux_layers=(0, 1, 1), max_tokens=6, shard_size=2, temperatures=(0.0,))
    paths = generate_data(engine, prompts, config)
    assert [p.name for p in paths] == ["shard-00000.safetensors", "shard-00001.safetensors"]
    shard = load_file(str(paths[0]))
    d = engine.runner.model_config.hidden_size
    n = shard["token_ids"].shape[0]
    assert shard["aux"].shape == (n, 3 * d) and shard["last"].shape == (n, d)
    conversations = read_conversations(paths)
    assert len(conversations) == 3
    for conv in conversations:  # the teacher-forced pass agrees with the engine's own greedy choices
        answer = conv.token_ids[conv.prompt_len :]
        assert 1 <= len(answer) <= 6
        logits = target_logits(engine.runner.weights, engine.runner.model_config, conv.last[conv.prompt_len - 1 : -1].float())
        assert torch.equal(logits.argmax(-1), answer)
    # cached shards are reused; a spent budget starts no new one
    assert generate_data(engine, prompts, config, budget_s=0) == paths
    assert generate_data(engine, build_prompts()[:8], config, budget_s=0) == paths


def test_shards_overlap_in_the_engine_yet_each_holds_its_own_prompts_in_order(tmp_path):
    # 2 running requests at once, shards of 3: a shard's last answer shares the engine with the next
    # shard's first, and every conversation still lands in its own shard at its own place
    engine = LLMEngine(EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32", max_num_seqs=2))
    prompts = build_prompts()[:4]
    config = DataGenConfig(tmp_path, aux_layers=(0, 1, 1), max_tokens=5, shard_size=3, temperatures=(0.0, 0.7))
    paths = generate_data(engine, prompts, config)
    assert len(paths) == 3 and not engine.has_unfinished
    conversations = read_conversations(paths)
    jobs = [(p, t) for t in config.temperatures for p in prompts]
    assert len(conversations) == len(jobs)
    for conv, (prompt, _) in zip(conversations, jobs):
        text = engine.tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True)
        assert conv.token_ids[: conv.prompt_len].tolist() == engine.tokenizer.encode(text)
        assert 1 <= len(conv.token_ids) - conv.prompt_len <= 5


def test_held_out_prompts_never_appear_in_training():
    train, held_out = split(build_prompts())
    assert held_out and len(train) > 10 * len(held_out)
    def texts(prompts):
        return {json.dumps(p.messages) for p in prompts}

    assert not texts(train) & texts(held_out)
    assert {p.kind for p in build_prompts()} == {"chat", "tool", "json", "code"}
