#!/bin/bash
# The GPU suite on a machine without network (see docs/GPU.md): wheels from $BUNDLE/wheels (tests/gpu/bundle.sh
# made them), draftsmith from this working tree, the tiny zoo from $BUNDLE/home. Run from anywhere:
#   bash tests/gpu/offline.sh [pytest arguments]        # report: $OUT (default runs/gpu)/report.json and report.md
cd "$(dirname "$0")/../.." || exit 1
BUNDLE=${BUNDLE:-.gpu}
OUT=${OUT:-runs/gpu}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/draftsmith-site}; PKG=${PKG:-/tmp/draftsmith-pkg}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$BUNDLE"/wheels/*.whl > "$OUT/pip.log" 2>&1 || { tail -20 "$OUT/pip.log"; exit 1; }
mkdir -p "$PKG/draftsmith"  # the package layout of pyproject.toml's package-dir, as links to this tree
for d in common trainers data inference kernels launch; do ln -sfn "$PWD/$d" "$PKG/draftsmith/$d"; done
export PYTHONPATH=$PKG:$SITE DRAFTSMITH_HOME=$PWD/$BUNDLE/home DRAFTSMITH_GPU_REPORT_DIR=$OUT
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import sys, torch, transformers, triton; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', \
torch.version.cuda, 'transformers', transformers.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0))"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout "${SUITE_SECONDS:-1800}" python3 -m pytest -q -m gpu tests/gpu --timeout=600 -rfE --junitxml="$OUT/junit.xml" \
  "$@" 2>&1 | tee "$OUT/pytest.log" | grep -v "^\s*$" | tail -60
