#!/bin/bash
# What the GPU suite needs on a machine without network, gathered here into $BUNDLE (default .gpu): wheels for its
# Python (default 3.12, manylinux x86-64) of the packages its image lacks, and a copy of the built tiny zoo.
#   bash tests/gpu/bundle.sh [PACKAGE==VERSION ...]     # default: the versions installed here of DEFAULT_PACKAGES
# Then copy the working tree with $BUNDLE to the GPU machine and run tests/gpu/offline.sh there (docs/GPU.md).
cd "$(dirname "$0")/../.." || exit 1
BUNDLE=${BUNDLE:-.gpu}; PY=${PY:-.venv/bin/python}; PYVER=${PYVER:-3.12}
# an image with torch, triton, accelerate, peft, tokenizers, safetensors, pyarrow, pandas and pytest lacked these:
DEFAULT_PACKAGES="transformers datasets dill multiprocess optuna alembic colorlog mako sqlalchemy fsspec"
if [ $# -eq 0 ]; then
  set -- $($PY -m pip list --format=freeze 2>/dev/null | grep -i -E "^($(echo $DEFAULT_PACKAGES | tr ' ' '|'))==")
fi
mkdir -p "$BUNDLE/wheels" "$BUNDLE/home/zoo"
$PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$BUNDLE/wheels" "$@" || exit 1
ZOO=${DRAFTSMITH_HOME:-$HOME/.cache/draftsmith}/zoo/tiny
[ -f "$ZOO/manifest.json" ] || { echo "build the tiny zoo first: draftsmith zoo build --size tiny"; exit 1; }
rm -rf "$BUNDLE/home/zoo/tiny" && cp -r "$ZOO" "$BUNDLE/home/zoo/tiny"
du -sh "$BUNDLE"
