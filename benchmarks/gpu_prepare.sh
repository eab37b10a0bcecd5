#!/usr/bin/env bash
# Prepares what benchmarks/bench_gpu.py needs on a GPU machine without network (issue 45), in
# .gpu/ at the repository root (git ignores it through .git/info/exclude; the device call
# carries it: carry [".gpu"]):
#
#   .gpu/whl/        wheels (Python 3.12, x86_64) of what drvenus's command line and training
#                    import and the device image lacks (its list: KINDS.md of the device tool):
#                    orjson, json5, pydantic (+ pydantic-core, typing-inspection,
#                    annotated-types, typing-extensions >= 4.16), pydantic-settings,
#                    python-dotenv, platformdirs, tantivy, linkify-it-py (+ uc-micro-py).
#                    torch, transformers, accelerate, peft, tokenizers, safetensors, pyarrow,
#                    numpy, typer, rich, httpx, pyyaml and jinja2 are in the image.
#   .gpu/tokenizer/  the embedded SmolLM2's tokenizer and chat template (from its GGUF; the
#                    98 MB GGUF itself does not travel)
#   --reference      also .gpu/cpu_reference.json: check 2's CPU losses computed here
#                    (bench_gpu.py --write-cpu-reference; pass --cpu-reference to use it)
#   --recipe         also .gpu/recipe/: the embedded recipe's data (recipes/embedded/
#                    build_data.py, 1-2 minutes here), which check 3 then trains on
#
# Usage: bash benchmarks/gpu_prepare.sh [--reference] [--recipe]   (PYTHON=... to choose the
# interpreter; default .venv/bin/python, else python3). Needs the network (pip) once.
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
reference=0
recipe=0
for arg in "$@"; do
    case "$arg" in
        --reference) reference=1 ;;
        --recipe) recipe=1 ;;
        *) echo "unknown option: $arg (use --reference, --recipe)" >&2; exit 2 ;;
    esac
done

exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"

# One version of each (two stop the whole install on the device); the versions the project's
# tests run with.
WHEELS=(
    orjson==3.13.0 json5==0.17.3
    pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0
    typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4
    platformdirs==4.14.9 tantivy==0.27.0 linkify-it-py==2.2.0 uc-micro-py==2.0.0
)
rm -rf .gpu/whl
mkdir -p .gpu/whl
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .gpu/whl "${WHEELS[@]}"

rm -rf .gpu/tokenizer
"$PY" - <<'EOF'
import shutil
import sys

sys.path.insert(0, "benchmarks")
from _embedded_tokenizer import embedded_tokenizer_dir  # noqa: E402

shutil.copytree(embedded_tokenizer_dir(), ".gpu/tokenizer")
EOF

if [ "$reference" = 1 ]; then
    "$PY" benchmarks/bench_gpu.py --write-cpu-reference .gpu/cpu_reference.json \
        --tokenizer .gpu/tokenizer
fi
if [ "$recipe" = 1 ]; then
    rm -rf .gpu/recipe
    "$PY" recipes/embedded/build_data.py --out .gpu/recipe --tokenizer .gpu/tokenizer
    # check 3 reads clean/cleaned_resampled.parquet and rl/train-rl.jsonl; the rest stays here
    find .gpu/recipe -mindepth 1 -maxdepth 1 ! -name clean ! -name rl -exec rm -rf {} +
fi

tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)
gpu=$(du -sb .gpu | cut -f1)
echo "prepared .gpu/: what travels is the working tree ($((tree / 1048576)) MiB) and .gpu" \
    "($((gpu / 1048576)) MiB); the device takes 64 MiB at most"
