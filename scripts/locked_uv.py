"""Print the pip requirement of the uv that uv.lock pins, with the hashes of its files, for
``pip install --require-hashes``: the scripts bootstrap uv from the lock itself. Standard library
only: it runs before any environment exists."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

LOCK = Path(__file__).resolve().parent.parent / "uv.lock"


def main() -> int:
    packages = tomllib.loads(LOCK.read_text())["package"]
    uv = [package for package in packages if package["name"] == "uv"]
    if len(uv) != 1:
        print(f"{LOCK.name} pins no single uv (the dev group lost it?)", file=sys.stderr)
        return 1
    files = [uv[0]["sdist"], *uv[0]["wheels"]]
    hashes = " ".join(f"--hash={file['hash']}" for file in files)
    print(f"uv=={uv[0]['version']} {hashes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
