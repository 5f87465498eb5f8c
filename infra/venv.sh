#!/usr/bin/env bash
# Creates a virtual environment from a lock file, exactly its pins, no resolution (--no-deps).
#   infra/venv.sh VENV LOCK PYTHON [--editable]
# With uv (on PATH, or installed from PyPI into .cache/tools on first use: about 5 s) the ~280 wheels of the main lock
# install in about 30 s (their .pyc files are written at first import); where uv cannot be had, or fails, pip does
# the same in about 3 minutes.
# Pip's own settings that uv does not read (PIP_FIND_LINKS, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, and find-links from
# pip's configuration files) are passed on to it, so both install the same files. GRPO_INSTALLER=pip forces pip.
# Prints one line before and one after; the installers' output goes to VENV/install.log.
set -euo pipefail
venv=$1 lock=$2 python=$3 editable=${4:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/.cache/tools
log=$venv/install.log

find_uv() {
    if [[ ${GRPO_INSTALLER:-uv} == pip ]]; then return 1; fi
    if command -v uv >/dev/null 2>&1; then command -v uv; return; fi
    if [[ ! -x $tools/bin/uv ]]; then
        "$python" -m pip install --quiet --disable-pip-version-check --target "$tools" uv >/dev/null 2>&1 || return 1
    fi
    echo "$tools/bin/uv"
}

with_uv() {
    local uv=$1 links args=()
    links=${PIP_FIND_LINKS:-$("$python" -m pip config get global.find-links 2>/dev/null || true)}
    for link in $links; do args+=(--find-links "$link"); done
    if [[ -n ${PIP_INDEX_URL:-} ]]; then args+=(--default-index "$PIP_INDEX_URL"); fi
    for index in ${PIP_EXTRA_INDEX_URL:-}; do args+=(--index "$index"); done
    [[ -x $venv/bin/python ]] || "$uv" venv --quiet --python "$python" "$venv"
    export UV_LINK_MODE=${UV_LINK_MODE:-copy}  # the cache may be on another file system
    # No --compile-bytecode: compiling all 34k modules took 65-88 s of the install on 2 cores, and a run imports about
    # a fifth of them. Python writes each module's .pyc at its first import instead; the Makefile unexports
    # PYTHONDONTWRITEBYTECODE (set on CI and on these machines), without which every process (each Ray actor, each
    # `grpo` subprocess) would compile vLLM, DeepSpeed and torch again: `from vllm import LLM` 45 s instead of 20.
    "$uv" pip install --python "$venv/bin/python" --no-deps "${args[@]}" -r "$lock" >"$log" 2>&1 \
        || return 1
    if [[ $editable == --editable ]]; then
        "$uv" pip install --python "$venv/bin/python" --no-deps --no-build-isolation -e "$root" >>"$log" 2>&1 \
            || return 1
    fi
}

with_pip() {
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --no-deps -r "$lock" >>"$log" 2>&1 || return 1
    if [[ $editable == --editable ]]; then
        "$venv/bin/pip" install --no-deps --no-build-isolation -e "$root" >>"$log" 2>&1 || return 1
    fi
}

start=$(date +%s)
count=$(grep -cE '^[A-Za-z0-9]' "$lock")
installed=
if uv=$(find_uv); then
    echo "==> $venv: $count packages from $lock with uv (about 30 s; log: $log)"
    if with_uv "$uv"; then
        installed=uv
    else
        echo "==> uv failed (the end of its log below); installing with pip instead (about 3 minutes)" >&2
        tail -5 "$log" >&2
        rm -rf "$venv"
    fi
else
    echo "==> $venv: $count packages from $lock with pip (uv not available; about 3 minutes; log: $log)"
fi
if [[ -z $installed ]]; then
    mkdir -p "$venv"
    : >"$log"
    with_pip || { tail -20 "$log" >&2; exit 1; }
fi
echo "==> $venv ready in $(( $(date +%s) - start )) s"
