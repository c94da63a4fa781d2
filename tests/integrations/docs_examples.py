"""The runnable examples of docs/integrations.md: a ``python`` block right after a line
``<!-- example: NAME -->``, which defines ``async def main(redis_url, ...)``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def example(name: str) -> Any:
    """The ``main`` of the example ``name``, its block executed as a module."""
    pattern = rf"<!-- example: {re.escape(name)} -->\n```python\n(.*?)```"
    found = re.search(pattern, DOC.read_text(), re.S)
    assert found is not None, f"docs/integrations.md lost its example {name!r}"
    namespace: dict[str, Any] = {"__name__": f"docs_example_{name.replace('-', '_')}"}
    exec(compile(found.group(1), f"docs/integrations.md ({name})", "exec"), namespace)
    return namespace["main"]
