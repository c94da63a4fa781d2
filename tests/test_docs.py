"""The README's library example runs as written, against a real server."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).parent.parent / "README.md"


async def test_readme_library_example_runs(redis_url: str, capsys: Any) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README lost its library example"
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    await namespace["main"](redis_url)
    assert capsys.readouterr().out.startswith("cancelled cancelled ")
