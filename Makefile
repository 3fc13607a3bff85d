# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.draftsmith-installed
TORCH_SPEC ?= torch==2.13.0
# pytest-xdist workers for the default suite: one per core of the 2-core CI machine (each runs torch on its share)
TEST_WORKERS ?= 2

.PHONY: help install demo test test-slow test-engine test-gpu gpu-bundle engine lint zoo bench bench-grid bench-peers clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install torch (CPU) and draftsmith[dev]

lint: install ## ruff and import-linter (the layer contract)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports

test: install lint ## lint, then the default test suite (TEST_WORKERS pytest-xdist workers)
	$(PY) -m pytest -q --timeout=900 -n $(TEST_WORKERS)

test-slow: zoo ## the long tests (@pytest.mark.slow), on TEST_WORKERS workers, the tiny zoo built first on every core
	$(PY) -m pytest -q -m slow --timeout=3600 -n $(TEST_WORKERS)

engine: install ## the vLLM environment `draftsmith eval --engine` runs in (DRAFTSMITH_HOME/engines/vllm)
	$(VENV)/bin/draftsmith engine setup

test-engine: engine ## the vLLM round trips (@pytest.mark.engine): exports load and draft as in draftsmith's loop
	$(PY) -m pytest -q -m engine --timeout=3600

test-gpu: install ## the GPU suite (@pytest.mark.gpu; skipped without CUDA): runs/gpu/report.json and report.md
	$(PY) -m pytest -q -m gpu tests/gpu --timeout=1800

gpu-bundle: install ## wheels and the tiny zoo for `make test-gpu` on a GPU machine without network (docs/GPU.md)
	bash tests/gpu/bundle.sh

demo: install ## build the tiny zoo, distil its draft (300 steps), print the evaluator's summary
	$(VENV)/bin/draftsmith demo
	$(PY) recipes/distillspec.py max_steps=300 max_train_examples=4000 output_dir=runs/distillspec_demo

zoo: install ## build the tiny model zoo
	$(VENV)/bin/draftsmith zoo build --size tiny

# The figures of docs/BENCHMARKS.md (about 35 minutes on 2 idle cores once the zoo exists, 25 of them float32 against
# bfloat16 on SmolLM2's shape); bench-grid is the
# DistillSpec divergence x data grid (about 45 minutes).
bench: install ## the side-by-side figures of docs/BENCHMARKS.md (~35 min once the zoo exists)
	$(VENV)/bin/draftsmith eval --method draft --compare hf --limit 20 --max-new-tokens 64 --threads 1 \
		--out runs/bench/compare_hf/report.json
	$(PY) tests/benchmarks/bench_gkd.py --steps 100 --repeats 2 --json runs/bench/gkd.json
	$(PY) tests/benchmarks/bench_kernel_memory.py --json runs/bench/kernel_memory.json
	$(PY) tests/benchmarks/bench_precision.py --threads 1 --json runs/bench/precision.json

bench-peers: engine zoo ## draftsmith's EAGLE-3 against speculators' trainer: same data, steps, vLLM (~30 min)
	$(PY) tests/benchmarks/bench_peers.py setup
	$(PY) tests/benchmarks/bench_peers.py run --steps 300 --concurrency 1,4,16 --out runs/bench/peers

bench-grid: install ## the DistillSpec divergence x data grid (~45 min)
	$(PY) tests/benchmarks/bench_distillspec_grid.py --out-dir runs/distillspec_grid --steps 300 --jobs 2

clean: ## remove build outputs and runs/
	rm -rf build dist *.egg-info runs

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-11s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
