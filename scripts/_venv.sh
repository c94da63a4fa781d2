# Sourced by scripts/*: make .venv with a Python >= 3.11 and install the project with the given
# extras into it; re-installs only when pyproject.toml changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

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

ensure_venv() {
    # $1: the project's extras to install; $VENV: the environment (default .venv)
    local extras="$1" venv="${VENV:-.venv}"
    if [ ! -x "$venv/bin/python" ]; then
        "$(find_python)" -m venv "$venv"
    fi
    local stamp
    stamp="$venv/.installed-$(sha256sum < pyproject.toml | cut -c1-16)-${extras//,/-}"
    if [ ! -f "$stamp" ]; then
        echo "installing into $venv (.${extras:+[$extras]}) ..." >&2
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e ".${extras:+[$extras]}"
        touch "$stamp"
    fi
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
