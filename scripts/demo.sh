#!/usr/bin/env bash
# Set up and run rmserve's main job on the CPU: a tiny random-weight demo reward model scored on
# RM-Bench, the official table printed at the end. Idempotent: a second call reuses the venv,
# the demo model and the finished scores.
#
#   bash scripts/demo.sh [DATA]
#
# DATA: a local RM-Bench copy (a folder of *_filtered.json release files, or total_dataset.json);
# default: $RMSERVE_DATA, else ../shared/data/rm-bench when it exists, else the hub dataset
# THU-KEG/RM-Bench (downloaded once into the Hugging Face cache).
# Environment: RMSERVE_VENV (default .venv), RMSERVE_OUT (default runs/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh

venv=${RMSERVE_VENV:-.venv}
out=${RMSERVE_OUT:-runs/demo}
data=${1:-${RMSERVE_DATA:-}}
if [[ -z "$data" && -d ../shared/data/rm-bench ]]; then
    data=../shared/data/rm-bench
fi

ensure_venv "$venv" cpu,hf
rmserve=("$venv/bin/rmserve")

if [[ -z "$data" ]]; then
    say "no local RM-Bench copy given: fetching the hub dataset THU-KEG/RM-Bench"
    data=$("$venv/bin/python" -c \
        "from huggingface_hub import snapshot_download as s; print(s('THU-KEG/RM-Bench', repo_type='dataset'))")
fi
say "RM-Bench data: $data"

model=runs/demo-rm
if [[ -f "$model/config.json" ]]; then
    say "demo model $model already built"
else
    say "building the demo model $model (random weights; the tokenizer is trained on the data)"
    rm -rf "$model"
    "${rmserve[@]}" demo-model "$model" --corpus "$data"
fi

say "scoring: rmserve run $model --bench rm-bench --data $data --out $out --dtype float32"
exec "${rmserve[@]}" run "$model" --bench rm-bench --data "$data" --out "$out" --dtype float32
