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
    local extras="$1"
    if [ ! -x .venv/bin/python ]; then
        "$(find_python)" -m venv .venv
    fi
    local stamp
    stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/-}"
    if [ ! -f "$stamp" ]; then
        .venv/bin/python -m pip install --quiet --upgrade pip
        .venv/bin/python -m pip install --quiet -e ".[${extras}]"
        rm -f .venv/.installed-*
        touch "$stamp"
    fi
}
