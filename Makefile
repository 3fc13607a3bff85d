# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.draftsmith-installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-slow lint zoo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(PY) -m ruff check .

test: install lint
	$(PY) -m pytest -q --timeout=900

test-slow: install
	$(PY) -m pytest -q -m slow --timeout=7200

demo: install
	$(VENV)/bin/draftsmith demo
	$(PY) recipes/distillspec.py

zoo: install
	$(VENV)/bin/draftsmith zoo build --size tiny

clean:
	rm -rf build dist *.egg-info runs
