"""Write a model the built-in engine loads as a Hugging Face checkpoint directory, so that other
engines (vLLM, SGLang, trtllm-serve) serve the very weights and tokenizer that ours does:

    config.json, generation_config.json    a LlamaForCausalLM config (ModelConfig.to_hf)
    model.safetensors                      Hugging Face-layout weights, float32 (weights.runtime_to_hf)
    tokenizer.json, tokenizer_config.json  the engine's tokenizer and chat template

A GGUF (the shipped SmolLM2 one included) is dequantised on the way, so the checkpoint holds the
exact float32 model the built-in engine's deterministic mode runs. By default the directory sits
beside the converted-model cache, `<cache_dir>/hf/<cache entry name>/`: exported once, found there
after. It is written aside and renamed into place, so a reader sees a whole checkpoint or none.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file

from engines.builtin.config import EngineConfig
from engines.builtin.loader import LoadedModel, cache, load_model, smollm2_gguf_path
from engines.builtin.runner.weights import runtime_to_hf

CONFIG_FILE = "config.json"  # written last: its presence marks a complete checkpoint


def default_export_dir(config: EngineConfig) -> Path:
    """Where `export_hf` writes `config.model` when no directory is given: `<cache_dir>/hf/<name>`,
    named as the converted-model cache names its entry (so a changed source gets a fresh export)."""
    spec, root = config.model, Path(config.cache_dir).expanduser() / "hf"
    if spec.startswith("random:"):
        return root / spec.replace(":", "-")
    source = smollm2_gguf_path() if spec == "smollm2" else Path(spec).expanduser()
    if source.is_dir():
        raise ValueError(f"model={spec!r} is a directory, which the engine loads as a Hugging Face checkpoint already")
    if not source.is_file():
        load_model(config)  # raises its FileNotFoundError, which says what model may name
    return root / cache.entry_dir(Path(config.cache_dir), source).name


def export_hf(config: EngineConfig, out: Path | None = None) -> Path:
    """Write `config.model` as a Hugging Face checkpoint into `out` (default: `default_export_dir`)
    and return the directory; one already complete there is kept as it is."""
    out = (out or default_export_dir(config)).expanduser()
    if (out / CONFIG_FILE).is_file():
        return out
    loaded = load_model(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        write_checkpoint(tmp, loaded)
        for path in (tmp, *tmp.iterdir()):  # mkdtemp makes the directory private; a cache is shared
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / CONFIG_FILE).is_file():  # not a lost race with another exporter: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_checkpoint(directory: Path, loaded: LoadedModel) -> None:
    model = loaded.config
    weights = {name: tensor.float().cpu() for name, tensor in runtime_to_hf(loaded.weights, model).items()}
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    loaded.tokenizer.save(directory)
    tokenizer_config_path = directory / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    # transformers' AutoTokenizer then takes tokenizer.json as it is (no class-specific rebuild),
    # and the gateway's `tokenizer_dir` reads the context length from here
    tokenizer_config |= {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": model.max_position_embeddings}
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, ensure_ascii=False, indent=1))
    generation = {"bos_token_id": model.bos_token_id, "eos_token_id": list(model.eos_token_ids)}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=1))
    hf_config = model.to_hf() | {"torch_dtype": "float32"}
    (directory / CONFIG_FILE).write_text(json.dumps(hf_config, indent=1))
