"""A sentence-transformers checkpoint directory served as one encoder: texts -> unit vectors.

The directory is what sentence-transformers saves: config.json + model.safetensors (a BERT-family
encoder, engines/embedding/bert.py), tokenizer.json, `1_Pooling/config.json` (mean, CLS or max
pooling over token states), `modules.json` (a `Normalize` module means L2-normalised output) and
`sentence_bert_config.json` (`max_seq_length`: longer inputs are truncated, as upstream).

`embed` batches its texts: one padded forward pass per `max_batch` texts, padding masked out of
attention and pooling, so a text's vector does not depend on its batch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import Tensor

from engines.embedding.bert import BertConfig, BertEncoder, read_weights

Pooling = Literal["mean", "cls", "max"]


@dataclass(frozen=True, slots=True)
class Embeddings:
    vectors: Tensor  # [n, d] float32
    num_tokens: list[int]  # per text, [CLS] and [SEP] included (after truncation)


def read_pooling(directory: Path) -> Pooling:
    path = directory / "1_Pooling" / "config.json"
    if not path.is_file():
        return "mean"
    raw = json.loads(path.read_text())
    keys: dict[Pooling, str] = {
        "mean": "pooling_mode_mean_tokens",
        "cls": "pooling_mode_cls_token",
        "max": "pooling_mode_max_tokens",
    }
    modes = [mode for mode, key in keys.items() if raw.get(key)]
    if len(modes) != 1:
        raise ValueError(f"{path}: exactly one of mean, cls or max pooling is supported, got {modes or 'none'}")
    return modes[0]


def has_normalize(directory: Path) -> bool:
    path = directory / "modules.json"
    return path.is_file() and any(m.get("type", "").endswith(".Normalize") for m in json.loads(path.read_text()))


def pool(hidden: Tensor, mask: Tensor, how: Pooling) -> Tensor:
    """hidden: [b, s, d], mask: [b, s] -> [b, d], padding left out."""
    if how == "cls":
        return hidden[:, 0]
    m = mask[..., None].to(hidden.dtype)
    if how == "max":
        return hidden.masked_fill(m == 0, torch.finfo(hidden.dtype).min).amax(1)
    return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)


class SentenceEncoder:
    def __init__(
        self, name: str, encoder: BertEncoder, tokenizer: Tokenizer, pooling: Pooling, normalize: bool,
        max_seq_length: int, max_batch: int = 32,
    ) -> None:
        self.name = name
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.pooling: Pooling = pooling
        self.normalize = normalize
        self.max_seq_length = max_seq_length
        self.max_batch = max_batch

    @property
    def dimensions(self) -> int:
        return self.encoder.config.hidden_size

    @classmethod
    def load(cls, directory: Path, name: str | None = None, max_batch: int = 32) -> SentenceEncoder:
        """Read a sentence-transformers directory (FileNotFoundError / ValueError say what is missing)."""
        config = BertConfig.from_file(directory / "config.json")
        limit = config.max_position_embeddings
        st_config = directory / "sentence_bert_config.json"
        if st_config.is_file():
            limit = min(limit, int(json.loads(st_config.read_text()).get("max_seq_length", limit)))
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tokenizer.enable_truncation(limit)
        tokenizer.no_padding()
        encoder = BertEncoder(config, read_weights(directory / "model.safetensors"))
        return cls(name or directory.name, encoder, tokenizer, read_pooling(directory), has_normalize(directory),
                   limit, max_batch)

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids, [CLS] and [SEP] included, truncated to `max_seq_length`."""
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def embed(self, texts: list[str]) -> Embeddings:
        ids = self.tokenize(texts)
        return Embeddings(self.embed_ids(ids), [len(row) for row in ids])

    def embed_ids(self, ids: list[list[int]]) -> Tensor:
        """[len(ids), d]: one padded forward pass per `max_batch` texts."""
        vectors = [self._embed_batch(ids[i : i + self.max_batch]) for i in range(0, len(ids), self.max_batch)]
        return torch.cat(vectors) if vectors else torch.empty(0, self.dimensions)

    def _embed_batch(self, batch: list[list[int]]) -> Tensor:
        width = max(len(ids) for ids in batch)
        input_ids = torch.zeros(len(batch), width, dtype=torch.long)  # pad id 0: masked out anyway
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        pooled = pool(self.encoder(input_ids, mask), mask, self.pooling)
        return F.normalize(pooled, dim=-1) if self.normalize else pooled
