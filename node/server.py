"""uvicorn as ``cancel-bus serve`` runs it: the port bound before the node joins its cluster,
and a stop in two steps. The first SIGINT/SIGTERM drains (readiness fails, runs get the drain
timeout, the rest are cancelled and recorded); the second cancels the runs still going at once.
Then uvicorn closes the connections left (5 s at most) and the node stops its embedded server:
exit code 0 and no traceback (uvicorn would re-raise the signal it caught)."""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
from types import FrameType

import uvicorn

from .service import NodeService

log = logging.getLogger("cancel_bus.node")


class PortInUse(OSError):
    """The address to listen on cannot be bound."""


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """A listening socket on ``host:port`` (as uvicorn binds it), or :class:`PortInUse`."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            hint = "the port is in use; stop what listens there or give another --port"
        elif exc.errno == errno.EADDRNOTAVAIL:
            hint = "the address is not one of this machine's; give another --host"
        else:
            hint = f"{exc.strerror or exc}; give another --host or --port"
        raise PortInUse(f"cannot listen on {host}:{port}: {hint}") from None
    sock.set_inheritable(True)
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn's server, with the node's two-step stop (see the module's docstring)."""

    def __init__(self, config: uvicorn.Config, node: NodeService) -> None:
        super().__init__(config)
        self.node = node
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task[None] | None = None
        self._joining: asyncio.Future[None] | None = None

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Bind first (:class:`PortInUse` before anything joins the cluster), then serve."""
        if sockets is None:
            sockets = [bind(self.config.host, self.config.port, self.config.backlog)]
        super().run(sockets=sockets)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's serve, its event loop noted first: :meth:`handle_exit` hands signals to it."""
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets=sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """The node joins its cluster before the app's lifespan runs, so a Redis that is not
        there is a :class:`CancelBusError` for the command to report, not a traceback. A signal
        while it joins (Redis slow or refusing) stops the join at once: exit code 0."""
        self._joining = asyncio.ensure_future(self.node.start())
        try:
            await self._joining
        except asyncio.CancelledError:
            if not self.should_exit:
                raise
            log.warning("stopped while joining the cluster")  # the node left what it had joined
            return
        try:
            await super().startup(sockets=sockets)
        except BaseException:  # uvicorn could not serve: the node leaves again
            await self.node.stop()
            raise

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The signal handler: hand the signal to the event loop (never re-raised later)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_signal, signal.Signals(sig))

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if not self.started:  # still starting: uvicorn stops (and drains) once started
            self.should_exit = True
            if self._joining is not None:
                self._joining.cancel()  # the node's join may wait a whole lease for Redis
        elif self._signals == 1:
            log.warning("%s: stopping", sig.name)
            self._drain = asyncio.create_task(self._drain_then_exit())
        elif self._signals == 2:
            log.warning("%s again: cancelling the runs still going now", sig.name)
            self.node.stop_now()
        else:
            log.warning("%s: already stopping (the runs left are being cancelled)", sig.name)

    async def _drain_then_exit(self) -> None:
        try:
            await self.node.drain()
        finally:
            self.should_exit = True
