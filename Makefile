# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.draftsmith-installed
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-slow lint zoo bench bench-grid clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

lint: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

test: install lint
	$(PY) -m pytest -q --timeout=900

test-slow: install
	$(PY) -m pytest -q -m slow --timeout=7200

demo: install
	$(VENV)/bin/draftsmith demo
	$(PY) recipes/distillspec.py max_steps=300 max_train_examples=4000 output_dir=runs/distillspec_demo

zoo: install
	$(VENV)/bin/draftsmith zoo build --size tiny

# The figures of docs/BENCHMARKS.md (about 10 minutes on 2 idle cores once the zoo exists); bench-grid is the
# DistillSpec divergence x data grid (about 45 minutes).
bench: install
	$(VENV)/bin/draftsmith eval --method draft --compare hf --limit 20 --max-new-tokens 64 --threads 1 \
		--out runs/bench/compare_hf/report.json
	$(PY) tests/benchmarks/bench_gkd.py --steps 100 --repeats 2 --json runs/bench/gkd.json
	$(PY) tests/benchmarks/bench_kernel_memory.py --json runs/bench/kernel_memory.json

bench-grid: install
	$(PY) tests/benchmarks/bench_distillspec_grid.py --out-dir runs/distillspec_grid --steps 300 --jobs 2

clean:
	rm -rf build dist *.egg-info runs
