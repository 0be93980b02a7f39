#!/usr/bin/env bash
# A sweep of three DPO policy checkpoints against one reference (one server, in-place policy
# swaps) against three separate `rmserve run`s of the same checkpoints: the largest reward
# difference, and that no swap restarted an engine.
#
#   bash benchmarks/dpo_sweep_vs_runs.sh REF [DATA] [WORK]
#
# REF: the reference (a causal LM folder, e.g. `rmserve demo-model REF --head causal --seed 2`);
# the three policies are demo causal LMs of seeds 1, 3 and 4 built under WORK (default
# /tmp/rmserve-dpo-sweep); DATA: RM-Bench folder (default ../shared/data/rm-bench); the chat
# domain is scored (--only chat, 129 groups). Run from the repository root with rmserve installed.
set -euo pipefail
ref=$(realpath "$1"); data=${2:-../shared/data/rm-bench}; work=${3:-/tmp/rmserve-dpo-sweep}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
rm -rf "$work"; mkdir -p "$work/ckpt"
steps=()
for seed in 1 3 4; do
    step=$((seed * 100)); steps+=("$step")
    rmserve demo-model "$work/ckpt/step-$step" --head causal --seed "$seed" --corpus "$data" > /dev/null 2>&1
done
printf 'sweep-token' > "$work/token"
port=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
rmserve serve "$work/ckpt/step-${steps[0]}" --kind dpo --ref-model "$ref" --dtype float32 --port "$port" \
    --admin-token-file "$work/token" --checkpoint-root "$work/ckpt" > "$work/server.log" 2>&1 &
server=$!
start=$(date +%s)
rmserve sweep --server "http://127.0.0.1:$port" --wait-for-server --checkpoints "$work/ckpt/step-*" \
    --bench rm-bench --data "$data" --only chat --out "$work/sweep" --store "$work/store.sqlite" \
    --admin-token-file "$work/token" -q > "$work/sweep.log" 2>&1
echo "sweep of ${#steps[@]} checkpoints: $(( $(date +%s) - start )) s (server start included)"
kill "$server"; wait "$server" || true
echo "engine restarts during the sweep: $(grep -c 'restarted on' "$work/server.log" || true)"
for step in "${steps[@]}"; do
    start=$(date +%s)
    rmserve run "$work/ckpt/step-$step" --kind dpo --ref-model "$ref" --bench rm-bench --data "$data" --only chat \
        --out "$work/run-$step" --dtype float32 -q > "$work/run-$step.log" 2>&1
    echo "separate run of step-$step: $(( $(date +%s) - start )) s"
done
python - "$work" "${steps[@]}" <<'PY'
import json, sys
work, steps = sys.argv[1], sys.argv[2:]
worst, n = 0.0, 0
for step in steps:
    def rewards(path):
        return {(r["domain"], r["id"]): r["rewards"] for r in map(json.loads, open(path))}
    sweep = rewards(f"{work}/sweep/checkpoints/step-{step}/rm-bench.scores.jsonl")
    alone = rewards(f"{work}/run-{step}/scores.jsonl")
    assert sweep.keys() == alone.keys(), (len(sweep), len(alone))
    for key in sweep:
        for a, b in zip(sweep[key], alone[key], strict=True):
            worst, n = max(worst, abs(a - b)), n + 1
print(f"{n} rewards over {len(steps)} checkpoints: max |sweep - separate run| = {worst:.3g}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
