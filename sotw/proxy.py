"""A TCP proxy in front of a broker that can cut every connection, or hold all traffic, on demand.

Clients that connect through it see what a network does to them: ``cut`` aborts every connection and refuses
new ones for a while (a broker restart as clients see it, or a network partition with resets), ``freeze``
keeps connections open but passes no byte until ``thaw`` (a partition that drops packets, a hung switch).
The broker behind it keeps running: its data, committed offsets and group state survive, and nothing of its
own recovery (log replay, cold caches) is exercised.

For every client to go through the proxy, the broker must advertise the proxy's address (Kafka's
``advertised.listeners``); a cluster needs one proxy per broker. ``KafkaBroker(proxied=True)`` does both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from types import TracebackType

from sotw.errors import BrokerError
from sotw.outage import Outage, now_ms

log = logging.getLogger(__name__)


class TcpProxy(contextlib.AbstractContextManager["TcpProxy"]):
    """Forward ``host:port`` to ``target_host:target_port`` from a background thread.

    Parameters
    ----------
    target_host, target_port
        Where connections are forwarded.
    host
        Loopback address to listen on.
    port
        Port to listen on; 0 picks a free one (read ``port`` after ``start``).

    Attributes
    ----------
    outages
        Every finished ``cut`` and ``freeze``, oldest first.
    """

    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1", port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port = port
        self.outages: list[Outage] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sotw-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.WriteTransport] = set()
        self._flowing = asyncio.Event()  # cleared while frozen; touched only on the loop's thread
        self._flowing.set()
        self._frozen_ms: int | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        """The ``HOST:PORT`` clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> TcpProxy:
        """Listen and forward; returns once the port accepts connections."""
        self._thread.start()
        self._call(self._listen())
        log.info("proxy %s -> %s:%d", self.address, self.target_host, self.target_port)
        return self

    def stop(self) -> None:
        """Close every connection and stop listening."""
        if not self._thread.is_alive():
            return
        self._call(self._close(reset=False))
        self._call(self._drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def cut(self, downtime_s: float) -> Outage:
        """Abort every connection (RST) and refuse new ones for ``downtime_s`` seconds; blocks meanwhile."""
        with self._lock:
            down_ms = now_ms()
            self._call(self._close(reset=True))
            time.sleep(downtime_s)
            self._call(self._listen())
            outage = Outage("cut", down_ms, now_ms())
            self.outages.append(outage)
            return outage

    def freeze(self) -> None:
        """Stop passing bytes either way, connections kept open (new ones wait too); no-op if frozen."""
        with self._lock:
            if self._frozen_ms is None:
                self._frozen_ms = now_ms()
                self._loop.call_soon_threadsafe(self._flowing.clear)

    def thaw(self) -> Outage | None:
        """Pass bytes again; return the freeze as an ``Outage``, or None if not frozen."""
        with self._lock:
            if self._frozen_ms is None:
                return None
            outage = Outage("freeze", self._frozen_ms, now_ms())
            self._frozen_ms = None
            self._loop.call_soon_threadsafe(self._flowing.set)
            self.outages.append(outage)
            return outage

    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10.0)  # type: ignore[arg-type]

    async def _listen(self) -> None:
        try:
            self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        except OSError as exc:
            raise BrokerError(f"the proxy cannot listen on {self.address}: {exc.strerror}") from None
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self, reset: bool) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for transport in list(self._links):
            if reset:
                transport.abort()
            else:
                transport.close()
        self._links.clear()

    async def _drain(self) -> None:
        """Let the connections' tasks see their transports closed and end."""
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            await asyncio.wait(others, timeout=5.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.transport.abort()  # the target is down: the client sees its connection reset
            return
        pair = {writer.transport, up_writer.transport}
        self._links |= pair
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self._links -= pair
            for transport in pair:
                transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # While frozen, at most one chunk per direction is held here; TCP flow control holds the rest.
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        writer.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
