"""The converted-model cache: a GGUF is parsed and dequantised once, then started from here.

An entry is a directory `<cache_dir>/models/<stem>-<key>/` holding

    weights.safetensors     runtime-layout float32 tensors (see model.hf_to_runtime), read by mmap
    tokenizer.json, tokenizer_config.json
    model.json              name, source and ModelConfig
    <kind>.safetensors      optional tensors derived from the weights at the first start that needed
                            them (e.g. "int4": the packed 4-bit weights, see weights.LlamaWeights.pack)

The key hashes the source's resolved path, size and mtime plus the format version, so a changed file
gets a fresh entry. Entries are written into a temporary directory and renamed into place, so a
reader sees a whole entry or none, and two processes converting at once both end with one entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import Tensor

from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.text.tokenizer import Tokenizer

FORMAT_VERSION = 2  # 2: the q4_1 format's kernel layout (linear.pack_q4_1, pack_q8_0) in the derived tensors


def entry_dir(cache_dir: Path, source: Path) -> Path:
    stat = source.stat()
    key = hashlib.sha256(f"{FORMAT_VERSION}|{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(cache_dir).expanduser() / "models" / f"{source.stem}-{key}"


def is_complete(entry: Path) -> bool:
    return (entry / "model.json").is_file()


def read_entry(entry: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer, str]:
    meta = json.loads((entry / "model.json").read_text())
    config = ModelConfig.from_dict(meta["config"])
    weights = load_file(entry / "weights.safetensors")
    return config, weights, read_tokenizer(entry), meta["name"]


def read_tokenizer(entry: Path) -> Tokenizer:
    return Tokenizer.load(entry)


def write_entry(entry: Path, source: Path, config: ModelConfig, weights: dict[str, Tensor], tokenizer: Tokenizer, name: str) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp / "weights.safetensors")
        tokenizer.save(tmp)
        meta = {"format_version": FORMAT_VERSION, "name": name, "source": str(source.resolve()), "config": config.to_dict()}
        (tmp / "model.json").write_text(json.dumps(meta, indent=1))
        for path in (tmp, *tmp.iterdir()):  # mkdtemp makes the directory private; the cache is shared
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not is_complete(entry):  # not a lost race with another writer: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_derived(entry: Path, kind: str) -> dict[str, Tensor] | None:
    """The tensors `write_derived` stored under `kind`, or None when there are none yet."""
    path = entry / f"{kind}.safetensors"
    return load_file(path) if path.is_file() else None


def write_derived(entry: Path, kind: str, tensors: dict[str, Tensor]) -> None:
    """Store tensors derived from the entry's weights; written aside and renamed, so a reader sees all or none."""
    fd, tmp = tempfile.mkstemp(prefix=f".{kind}-", suffix=".safetensors", dir=entry)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, entry / f"{kind}.safetensors")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
