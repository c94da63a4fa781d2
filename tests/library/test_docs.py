"""The README's library examples run as written, against a real server; the design's module
map names the library's modules as they are."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from cancel_bus import CancelBus, SessionBusy

from ..conftest import BusFactory
from ..helpers import WAIT, eventually

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"


async def test_readme_library_example_runs(redis_url: str, capsys: Any) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README lost its library example"
    namespace: dict[str, Any] = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    await namespace["main"](redis_url)
    assert capsys.readouterr().out.startswith("cancelled cancelled ")


# what each strategy leaves: (end reason, output) of the follow-up, then of the first run
ENDS = {
    "interrupt": [("completed", "draft[then: shorter]"), ("interrupted", "draft")],
    "rollback": [("completed", "[then: shorter]"), ("rolled_back", "")],
    "enqueue": [("completed", "[then: shorter]"), ("completed", "draft")],
}


@pytest.mark.parametrize("strategy", [*ENDS, "reject"])
async def test_the_readme_double_texting_example_runs(
    make_bus: BusFactory, capsys: Any, strategy: str
) -> None:
    """The follow-up of the README, with each strategy, while the session's run goes on on
    another node (it ends by itself once told to, for ``enqueue``)."""
    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
        if "multitask_strategy" in b
    ]
    namespace: dict[str, Any] = {"CancelBus": CancelBus}
    exec(compile(block, "README.md", "exec"), namespace)
    owner, other = await make_bus(), await make_bus()
    entered, done = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with owner.run(app_name="chat", user_id="u1", session_id="s1") as run:
            run.emit("draft")
            entered.set()
            while not done.is_set():
                run.checkpoint()
                await asyncio.sleep(0.01)

    task = asyncio.create_task(first())
    async with asyncio.timeout(WAIT):
        await entered.wait()
    following = asyncio.create_task(namespace["follow_up"](other, "shorter", strategy))
    if strategy == "reject":
        with pytest.raises(SessionBusy):
            await following
        done.set()
        await task
        return
    if strategy == "enqueue":
        await eventually(lambda: _queued(other))
        assert capsys.readouterr().out.endswith(" waits its turn\n")
        done.set()
    await asyncio.wait_for(following, WAIT)
    await task
    runs = await other.list_runs("all", app_name="chat")
    assert [(r.end_reason, r.output) for r in runs] == ENDS[strategy]


async def _queued(bus: CancelBus) -> bool:
    return bool(await bus.list_runs("queued", app_name="chat"))


def test_the_design_module_map_names_every_library_module() -> None:
    design = (ROOT / "docs" / "DESIGN.md").read_text()
    section = design.split("## 13. Module map", 1)[1].split("\nnode/", 1)[0]
    mapped = set(re.findall(r"^  (\w+\.py) ", section, re.M))
    modules = {path.name for path in (ROOT / "cancel_bus").glob("*.py")}
    assert mapped == modules
