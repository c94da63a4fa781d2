"""A round-robin HTTP load balancer in front of replica processes, as the tests' clients see a
cluster: each request (not each connection) goes to the next replica, its response (an SSE
stream too) relayed as it comes. It runs on the test's event loop (uvicorn on a free port) and
records which replica served each request."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import uvicorn

from ..helpers import WAIT

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"host", b"content-length"}


class Balancer:
    """Round robin over ``backends`` (base URLs); ``served`` holds, per request, the index of
    the backend that got it."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self.served: list[int] = []
        self.url = ""
        self._next = 0
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(WAIT * 3))

    def aim(self, index: int) -> None:
        """The next request goes to backend ``index`` (the rotation goes on from there)."""
        self._next = index

    def _pick(self) -> int:
        index = self._next
        self._next = (index + 1) % len(self.backends)
        self.served.append(index)
        return index

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        target = self.backends[self._pick()] + scope["path"]
        if scope["query_string"]:
            target += "?" + scope["query_string"].decode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        request = self._http.build_request(scope["method"], target, headers=headers, content=body)
        response = await self._http.send(request, stream=True)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP
                    ],
                }
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._http.aclose()


@asynccontextmanager
async def balancing(backends: list[str]) -> AsyncIterator[Balancer]:
    """A balancer over ``backends``, listening on a free loopback port for the block."""
    balancer = Balancer(backends)
    listener = socket.create_server(("127.0.0.1", 0))
    balancer.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    config = uvicorn.Config(balancer, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    try:
        async with asyncio.timeout(WAIT):
            while not server.started:
                if serving.done():
                    await serving
                await asyncio.sleep(0.01)
        yield balancer
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, WAIT)
        await balancer.close()
