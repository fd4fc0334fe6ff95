"""The baselines `benchmarks/engine/compare.py` compares against, on the same GGUF weights: Hugging Face transformers
(float32, eager) and, when importable, llama-cpp-python. Each returns plain timings."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import torch


class TokenClock:
    """A transformers streamer that only records when each generated token arrives."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate() first hands over the prompt
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class HFBaseline:
    def __init__(self, gguf_path: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        started = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, torch_dtype=torch.float32
        ).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        self.load_s = time.perf_counter() - started
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id

    def generate_one(self, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
        """Greedy, exactly `max_tokens` tokens: (start time, arrival time of each token)."""
        clock = TokenClock()
        ids = torch.tensor([prompt])
        started = time.perf_counter()
        with torch.inference_mode():
            self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                do_sample=False, streamer=clock, pad_token_id=self.pad_id,
            )
        return started, clock.times

    def generate_batch(self, prompts: list[list[int]], max_tokens: int) -> float:
        """Greedy batch with left padding; returns wall seconds for len(prompts) * max_tokens tokens."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=mask, max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                do_sample=False, pad_token_id=self.pad_id,
            )
        elapsed = time.perf_counter() - started
        assert out.shape[1] == width + max_tokens
        return elapsed


class LlamaCppBaseline:
    """llama-cpp-python on the GGUF as shipped (Q4_1), when the package is installed."""

    def __init__(self, gguf_path: Path, n_ctx: int = 2048) -> None:
        from llama_cpp import Llama  # optional dependency

        # as many threads as torch uses (llama.cpp's own default is half the cores)
        self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=torch.get_num_threads(), verbose=False)

    def generate_one(self, prompt: list[int], max_tokens: int) -> tuple[float, list[float]]:
        self.llm.reset()
        times: list[float] = []
        started = time.perf_counter()
        for i, _ in enumerate(self.llm.generate(prompt, temp=0.0)):
            times.append(time.perf_counter())
            if i + 1 == max_tokens:
                break
        return started, times


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None
