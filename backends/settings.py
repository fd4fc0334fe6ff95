"""Settings of a backend process: one frozen object built at start-up and passed down.

Sources, highest first: constructor arguments (the CLI's flags), `EDGERUN_*` environment
variables (nested with `__`, e.g. `EDGERUN_ENGINE__NUM_KV_BLOCKS=4096`), the TOML file named by
`EDGERUN_CONFIG`, then the defaults here (the sources are backends/toml_settings.py's).
"""

from __future__ import annotations

from typing import Literal

from backends.toml_settings import TomlSettings
from engines.builtin.config import EngineConfig
from engines.tensorrt_llm.config import TrtllmConfig


class BackendSettings(TomlSettings):
    engine_kind: Literal["builtin", "trtllm"] = "builtin"
    engine: EngineConfig = EngineConfig()
    # TensorRT-LLM: by default `edgerun backend --engine trtllm` execs trtllm-serve with YAML rendered
    # from `trtllm`; with trtllm_in_process our own server hosts tensorrt_llm.LLM instead.
    trtllm: TrtllmConfig = TrtllmConfig()
    trtllm_in_process: bool = False
    region: str = "local"
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    host: str = "127.0.0.1"
    port: int = 8100
    max_queue: int = 64  # waiting requests beyond which the server answers 429
    shutdown_timeout_s: float = 10.0
    log_level: str = "info"
    log_json: bool = True
