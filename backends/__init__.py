"""The regional backend: `server/` hosts one engine behind the OpenAI-compatible backend protocol;
`client/` is the seam the gateway uses to reach any such backend (ours, trtllm-serve, vLLM, SGLang).
"""
