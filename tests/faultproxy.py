"""A TCP proxy in front of a real Redis server that injects faults: cut connections (RST), refuse
or black-hole new ones (a partition without any packet back), add latency, or answer every
command itself with one error reply (a server in a state the tests cannot put a real one in)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from node.embedded import free_port


class FaultProxy:
    def __init__(self, target_port: int, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self.latency = 0.0
        self.mode = "pass"  # pass | refuse | blackhole | answer
        self.reply = b""  # the error reply of the answer mode
        self.connections_made = 0
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._healed = asyncio.Event()
        self._healed.set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        return self

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def cut(self) -> None:
        """Reset every open connection (clients see a connection error)."""
        for client, upstream in list(self._links):
            _reset(client)
            _reset(upstream)
        self._links.clear()

    def refuse(self) -> None:
        """Cut, and reset new connections until :meth:`heal`."""
        self.mode = "refuse"
        self._healed.clear()
        self.cut()

    def blackhole(self) -> None:
        """Stop forwarding in both directions, without closing anything, until :meth:`heal`."""
        self.mode = "blackhole"
        self._healed.clear()

    def answer(self, reply: str) -> None:
        """Cut, and answer every command of new connections with the error ``reply`` (e.g.
        ``"READONLY You can't write against a read only replica."``) until :meth:`heal`."""
        self.mode = "answer"
        self.reply = f"-{reply}\r\n".encode()
        self._healed.clear()
        self.cut()

    def heal(self) -> None:
        self.mode = "pass"
        for writer in self._held:
            _reset(writer)
        self._held.clear()
        self._healed.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "refuse":
            _reset(writer)
            return
        if self.mode == "blackhole":
            self._held.add(writer)
            return
        if self.mode == "answer":
            await self._answer(reader, writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(writer)
            return
        if self.mode == "refuse":  # refused while this link was being made: it must not live
            _reset(writer)
            _reset(up_writer)
            return
        self.connections_made += 1
        link = (writer, up_writer)
        self._links.add(link)
        with contextlib.suppress(asyncio.CancelledError):  # the loop closing ends the link too
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        self._links.discard(link)
        for w in link:
            _close(w)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read each RESP command (an array of bulk strings) and answer it with the reply."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            while self.mode == "answer":
                header = await reader.readline()
                if not header.startswith(b"*"):
                    break
                for _ in range(int(header[1:])):
                    length = int((await reader.readline())[1:])
                    await reader.readexactly(length + 2)
                writer.write(self.reply)
                await writer.drain()
        _reset(writer)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if self.mode == "blackhole":
                await self._healed.wait()
            if self.latency:
                await asyncio.sleep(self.latency)
            writer.write(data)
            await writer.drain()
        _close(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            linger_now = struct.pack("ii", 1, 0)  # close with RST
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger_now)
    _close(writer)


def _close(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        writer.close()
