# Two entry points for a new user: `make test` and `make report`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MTP := $(VENV)/bin/mtp
RECIPE ?= quick

.PHONY: install test test-slow quick report bench clean

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

quick: $(VENV)/.installed
	$(MTP) train --recipe quick --objective ntp --out runs/quick-ntp --resume
	$(MTP) train --recipe quick --depth 1 --lambda 0.3 --out runs/quick-sequential --resume
	$(MTP) train --recipe quick --heads 4 --out runs/quick-parallel --resume

bench: $(VENV)/.installed
	$(PY) scripts/bench_train.py

clean:
	rm -rf runs .cache
