# Two entry points for a new user: `make test` and `make report`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MTP := $(VENV)/bin/mtp
RECIPE ?= quick

.PHONY: install test test-slow ablate plan report bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q

test-slow: $(VENV)/.installed
	$(PY) -m pytest -q -m slow

# The main job: results/$(RECIPE)/REPORT.md. `mtp ablate` does only what results/$(RECIPE) still lacks
# (everything on a fresh clone without results, nothing when they are complete), then the report is rendered.
report: ablate
	$(MTP) report results/$(RECIPE)

ablate: $(VENV)/.installed
	$(MTP) ablate --recipe $(RECIPE)

plan: $(VENV)/.installed
	$(MTP) ablate --recipe $(RECIPE) --dry-run

bench: $(VENV)/.installed
	$(PY) scripts/bench_train.py

clean:
	rm -rf runs .cache
