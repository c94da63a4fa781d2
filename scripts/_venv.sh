# Sourced by scripts/*: environments made from the project's locks, never from a fresh resolution.
# uv.lock pins every package of every environment (with hashes); requirements/lowest.txt the lowest
# versions the library allows. Both are written by ./scripts/lock alone.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export UV_PYTHON_DOWNLOADS=never  # the Python that made the environment, never a downloaded one

find_python() {
    for candidate in "${PYTHON:-}" python3 python3.13 python3.12 python3.11; do
        [ -n "$candidate" ] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    echo "cancel-bus needs Python >= 3.11 (set PYTHON=/path/to/python3.11)" >&2
    exit 1
}

bootstrap_uv() {
    # $1: an environment; puts the uv uv.lock pins into it, from PyPI, checked by its hashes
    local venv="$1" wanted requirement
    wanted="$("$venv/bin/python" scripts/locked_uv.py)"
    [ "uv==$("$venv/bin/uv" --version 2>/dev/null | cut -d' ' -f2)" != "${wanted%% *}" ] || return 0
    requirement="$(mktemp)"
    echo "$wanted" >"$requirement"
    if [ -x "$venv/bin/uv" ]; then  # an older uv (the lock moved on): pip may be gone by now
        "$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --no-deps \
            --require-hashes -r "$requirement"
    else
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
            --require-hashes -r "$requirement"
    fi
    rm -f "$requirement"
}

ensure_venv() {
    # $@: what to install, as uv sync takes it (--extra X, --group Y, --inexact);
    # $VENV: the environment (default .venv)
    local venv="${VENV:-.venv}"
    if [ ! -x "$venv/bin/python" ]; then
        "$(find_python)" -m venv "$venv"
    fi
    bootstrap_uv "$venv"
    echo "syncing $venv with uv.lock ($*) ..." >&2
    UV_PROJECT_ENVIRONMENT="$venv" "$venv/bin/uv" sync --locked --quiet "$@" || {
        echo "uv.lock does not match pyproject.toml (or a download failed, above):" \
            "run ./scripts/lock after changing the dependencies" >&2
        exit 1
    }
}

ensure_lowest_venv() {
    # .venv-lowest: the library at the lowest versions of its dependencies that pyproject.toml
    # allows, with the library's test tools (requirements/lowest.txt), by .venv's uv
    local venv=.venv-lowest
    if [ ! -x "$venv/bin/python" ]; then
        .venv/bin/uv venv --quiet --python "$(find_python)" "$venv"
    fi
    echo "syncing $venv with requirements/lowest.txt ..." >&2
    .venv/bin/uv pip sync --quiet --python "$venv/bin/python" --require-hashes \
        requirements/lowest.txt
    .venv/bin/uv pip install --quiet --python "$venv/bin/python" --no-deps -e .
}

ensure_chromium() {
    # The dashboard test drives a real headless Chromium (Debian's package). Install it where we
    # can (root with apt); elsewhere that one test is skipped with its reason.
    command -v chromium >/dev/null 2>&1 && return
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's chromium for the dashboard test ..." >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 &&
              apt-get install -y -q --no-install-recommends chromium >/dev/null 2>&1; } ||
            echo "could not install chromium; the dashboard test will be skipped" >&2
    fi
}
