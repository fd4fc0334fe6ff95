"""Inference engines behind one interface; servers (backends/server) host one.

    base.py             the interface every engine implements, as servers see it
    sampling_params.py  sampling parameters shared by every engine
    guided.py           what a constrained request asks the output to match (guided decoding)
    errors.py           errors an engine raises to its callers
    omp.py              torch's OpenMP threads and the Python threads that run torch work
    builtin/            the built-in PyTorch engine (CPU and CUDA)
    tensorrt_llm/       TensorRT-LLM: trtllm-serve configured and launched, and the in-process adapter
    embedding/          sentence embeddings: a BERT-family encoder, batched fairly between tenants
"""
