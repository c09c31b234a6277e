# The two commands: `make demo` (install + run the CPU demo) and `make test` (install + run tests).
# make demo OUT=runs/mine ARGS="--loop.seed=1"   puts the record in runs/mine, with config overrides
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch first, pinned to a CPU-friendly build: a bare `torch` requirement can pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
CONFIG ?= examples/addition.toml
OUT ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
ARGS ?=
PYTEST_ARGS ?=

.PHONY: demo test test-fast test-slow lint bench clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@$(MAKE) --no-print-directory system-deps
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[train,serve,test]"
	touch $@

# bubblewrap isolates model-written code (the tools environment's Python sandbox). Installed when
# this runs as root with apt-get (CI does); otherwise say how, and the sandbox refuses until it is there.
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null)) && echo "installed bubblewrap"; \
	  else echo "note: install bubblewrap (e.g. sudo apt-get install bubblewrap) to run the Python sandbox"; fi; }

demo: $(VENV)/.installed
	$(BIN)/rlvr train $(CONFIG) --out $(OUT) $(ARGS)

# The default suite, then the end-to-end runs marked slow.
test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench examples

bench: $(VENV)/.installed
	$(BIN)/python bench/step_time.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
