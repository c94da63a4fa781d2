"""The runnable examples of docs/integrations.md for agno, google-adk and pydantic-ai, run as
written (two nodes in one process, on the tests' server)."""

from __future__ import annotations

from typing import Any

import pytest

from .docs_examples import example

PRINTED = {
    "agno": ["True", "CANCELLED cancelled True"],
    "google-adk": ["cancelled INVOCATION_ABORTED"],
    "pydantic-ai": ["cancelled True"],
}


@pytest.mark.parametrize("name", PRINTED)
async def test_the_docs_example_runs(redis_url: str, capsys: Any, name: str) -> None:
    await example(name)(redis_url)
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if line in PRINTED[name]] == PRINTED[name]
