"""The README's library example runs as written, against a real server; the design's module map
names the library's modules as they are."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"


async def test_readme_library_example_runs(redis_url: str, capsys: Any) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README lost its library example"
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    await namespace["main"](redis_url)
    assert capsys.readouterr().out.startswith("cancelled cancelled ")


def test_the_design_module_map_names_every_library_module() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## 13. Module map", 1)[1].split("\nnode/", 1)[0]
    mapped = set(re.findall(r"^  (\w+\.py) ", section, re.M))
    modules = {path.name for path in (ROOT / "cancel_bus").glob("*.py")}
    assert mapped == modules
