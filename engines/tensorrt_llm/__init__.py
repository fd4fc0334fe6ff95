"""TensorRT-LLM integration: config rendering, trtllm-serve launch, in-process LLM API adapter.

    config.py    TrtllmConfig -> --extra_llm_api_options YAML and trtllm-serve disaggregated YAML
    examples.py  the checked-in example deployment under infra/trtllm/
    launcher.py  `edgerun backend --engine trtllm`: write the YAML, exec trtllm-serve
    adapter.py   the Engine protocol over tensorrt_llm.LLM (imports tensorrt_llm lazily)

Only adapter.py touches `tensorrt_llm`, and only inside its constructor: nothing else in
edgerun imports it (its PyPI package is a stub that downloads from NVIDIA's index).
"""
