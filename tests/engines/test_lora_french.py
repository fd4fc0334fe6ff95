"""The example adapter (data/lora/french/, made by `edgerun lora train` on data/french_qa.json) through the
real engine: on English questions it was not trained on, SmolLM2's greedy answers under the adapter are French
and, in the same batch, its answers without the adapter stay English. Exactness against the merged model is
test_lora.py's (random adapters); this checks that a trained adapter does what it was trained for."""

from __future__ import annotations

import re
from pathlib import Path

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.loader.peft import load_adapter
from engines.builtin.runner.model_runner import ModelRunner
from engines.sampling_params import SamplingParams
from tests.engines.conftest import NUM_KV_BLOCKS

LORA_DIR = Path(__file__).resolve().parents[2] / "data" / "lora"
HELD_OUT = ["Why is the sky blue?", "What is the capital of Canada?", "What is a rainbow?"]
FRENCH = {"le", "la", "les", "l", "est", "de", "des", "du", "et", "un", "une", "en", "je", "vous", "pour", "que",
          "qui", "dans", "il", "elle", "sont", "au", "avec", "pas", "ne", "d", "c", "se", "sur", "plus"}
ENGLISH = {"the", "is", "of", "and", "an", "to", "in", "you", "i", "it", "for", "that", "are", "with", "your",
           "can", "be", "this", "on", "as", "by", "its", "or"}


def language_counts(text: str) -> tuple[int, int]:
    """(common French words, common English words) in `text`; "a" is both, so it counts for neither."""
    words = re.findall(r"[a-zàâçéèêëîïôûùüÿœ]+", text.lower())
    return sum(w in FRENCH for w in words), sum(w in ENGLISH for w in words)


def test_language_counts_tell_french_from_english() -> None:
    assert language_counts("La capitale de l'Italie est Rome, et elle est belle.") == (7, 0)
    assert language_counts("The capital of Italy is Rome, and it is beautiful.") == (0, 6)


def test_the_example_adapter_is_rank_8_on_q_and_v(smollm2_default_runner: ModelRunner) -> None:
    adapter = load_adapter(LORA_DIR / "french", smollm2_default_runner.model_config)
    assert adapter.rank == 8 and adapter.config.target_modules == ("q_proj", "v_proj")
    assert sum(f.stat().st_size for f in (LORA_DIR / "french").iterdir()) < 2_000_000


def test_the_french_adapter_answers_held_out_questions_in_french(smollm2_default_runner: ModelRunner) -> None:
    engine = LLMEngine(EngineConfig(model="smollm2", num_kv_blocks=NUM_KV_BLOCKS, lora_dir=LORA_DIR), smollm2_default_runner)
    tokenizer = smollm2_default_runner.tokenizer
    greedy = SamplingParams(max_tokens=24)
    for i, question in enumerate(HELD_OUT):
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        engine.add_request(GenerationRequest(f"fr{i}", prompt, greedy, lora="french"))
        engine.add_request(GenerationRequest(f"en{i}", prompt, greedy))
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
    for i, question in enumerate(HELD_OUT):
        french, english = tokenizer.decode(tokens[f"fr{i}"]), tokenizer.decode(tokens[f"en{i}"])
        french_words, english_words = language_counts(french)
        assert french_words > english_words, f"{question!r} under the adapter: {french!r}"
        french_words, english_words = language_counts(english)
        assert english_words > french_words, f"{question!r} without it: {english!r}"
