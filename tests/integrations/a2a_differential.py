"""What the A2A differential suites share (no a2a-sdk import: both lines use it): the two targets
the same client script runs against, stock a2a-sdk on one process and the replicas behind a
round-robin balancer, and the scrubbing that makes their answers comparable: ids and timestamps
(each id replaced by its order of first appearance in the transcript, in every string where it
appears) and what depends on timing alone, said where the script scrubs it."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from .a2a_reads import read_again, reads
from .balancer import Balancer, balancing
from .replica import Replica

ID_KEYS = {
    "id",
    "taskId",
    "contextId",
    "messageId",
    "artifactId",
    "referenceTaskIds",
    "invocationId",
}
ID_KEYS |= {re.sub(r"([A-Z])", r"_\1", key).lower() for key in ID_KEYS}  # 0.3's snake_case too
TIME_KEYS = {"timestamp"}
CHUNKS = "t0 ..."


@dataclass
class Target:
    """Where the script sends its requests (``url``), and the servers behind it."""

    name: str
    url: str
    servers: list[str]
    http: httpx.AsyncClient
    balancer: Balancer | None = None

    def aim(self, index: int) -> None:
        """The next request goes to server ``index`` (behind the balancer; stock has one)."""
        if self.balancer is not None:
            self.balancer.aim(index)

    def next_server(self) -> int:
        """The server the next request goes to."""
        return self.balancer._next if self.balancer is not None else 0

    async def open(self, gate: str) -> None:
        """Let the agent's runs held at ``gate`` go on, on every server."""
        for server in self.servers:
            (await self.http.post(f"{server}/gates/{gate}")).raise_for_status()

    async def reads(self, task_id: str) -> int:
        return await reads(self.http, self.servers, task_id)

    async def read_again(self, task_id: str, before: int) -> None:
        """Until a request naming the task reached a server's handler (its store was read)."""
        await read_again(self.http, self.servers, task_id, before)


@dataclass
class Transcript:
    """The answers of one script run, as JSON, in order; ``ids`` their ids as first seen."""

    answers: list[tuple[str, Any]] = field(default_factory=list)

    def add(self, step: str, answer: Any) -> None:
        self.answers.append((step, answer))

    def scrubbed(self) -> list[tuple[str, Any]]:
        ids: dict[str, str] = {}
        for _, answer in self.answers:
            for value in _ids(answer):
                ids.setdefault(value, f"<id{len(ids) + 1}>")
        pattern = (
            re.compile("|".join(re.escape(i) for i in sorted(ids, key=len, reverse=True)))
            if ids
            else None
        )
        return [(step, _scrub(answer, ids, pattern)) for step, answer in self.answers]


def _ids(value: Any, key: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _ids(v, k)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _ids(item, key)
    elif isinstance(value, str) and key in ID_KEYS and value:
        yield value


def _scrub(value: Any, ids: dict[str, str], pattern: re.Pattern[str] | None) -> Any:
    if isinstance(value, dict):
        return {
            k: "<time>" if k in TIME_KEYS else _scrub(v, ids, pattern) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub(item, ids, pattern) for item in value]
    if isinstance(value, str) and pattern is not None:
        return pattern.sub(lambda match: ids[match.group(0)], value)
    return value


def chunks(answer: Any) -> Any:
    """Timing scrubbed: the chunks an agent streamed before a cancel stopped it ("t0 ", "t1 ",
    ... as far as it got), as a task's artifacts or as consecutive artifact events, kept as one
    "t0 ..." (both lines' JSON)."""
    if isinstance(answer, list):
        kept: list[Any] = []
        for item in answer:
            if _chunk(item) and kept and kept[-1] == CHUNKS:
                continue
            kept.append(CHUNKS if _chunk(item) else chunks(item))
        return kept
    if isinstance(answer, dict):
        texts = [artifact_text(artifact) for artifact in answer.get("artifacts", [])]
        if texts and texts == [f"t{i} " for i in range(len(texts))]:
            answer = {**answer, "artifacts": CHUNKS}
        return {key: chunks(value) for key, value in answer.items()}
    return answer


def artifact_text(artifact: dict[str, Any]) -> str:
    """The text of an artifact's parts (either line's JSON)."""
    return "".join(part.get("text", "") for part in artifact["parts"])


def _chunk(item: Any) -> bool:
    if not isinstance(item, dict):
        return False
    update = item.get("artifactUpdate", item if item.get("kind") == "artifact-update" else None)
    if update is None:
        return False
    text = artifact_text(update["artifact"])
    return bool(re.fullmatch(r"t\d+ ", text))


def difference(stock: list[Any], replicas: list[Any]) -> str:
    """Where the two transcripts differ, line by line (for the assertion's message)."""
    lines = [json.dumps(t, indent=1, sort_keys=True).splitlines() for t in (stock, replicas)]
    return "\n".join(difflib.unified_diff(*lines, "stock", "replicas", lineterm="", n=6))


@contextmanager
def stock_and_third(stock: str, replica: str, url: str, namespace: str) -> Iterator[list[Replica]]:
    """Stock on one process (module ``stock``, a namespace of its own: it has no use for it),
    and a third replica (module ``replica``); started together (their imports overlap)."""
    spawned = [
        Replica.spawn(stock, url, f"{namespace}-stock", 3.0, {}),
        Replica.spawn(replica, url, namespace, 3.0, {}),
    ]
    try:
        yield [Replica.ready(process, pipe) for process, pipe in spawned]
    finally:
        for process, _ in spawned:
            Replica(process, "", "").stop()  # SIGTERM, as the other replicas leave


@asynccontextmanager
async def stock_and_replicas(
    http: httpx.AsyncClient, processes: list[Replica], replicas: list[Replica]
) -> AsyncIterator[tuple[Target, Target]]:
    """Stock on one process, and the three replicas (``replicas`` and the third of
    ``processes``) behind the balancer."""
    stock, third = processes
    servers = [replica.url for replica in (*replicas, third)]
    async with balancing(servers) as balancer:
        yield (
            Target("stock", stock.url, [stock.url], http),
            Target("replicas", balancer.url, servers, http, balancer),
        )
