"""ServerThread: the HTTP server on a thread and event loop of its own, so neither the app's GUI
loop nor the engine thread serves sockets; `start()` returns once it listens, or says why not."""
from __future__ import annotations

import asyncio
import ipaddress
import threading

from aiohttp import web

from ..errors import LanechatError
from .app import OpenAIServer

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
SHUTDOWN_S = 2.0  # how long stopping waits for handlers after their streams were ended


class ServeError(LanechatError):
    """The server cannot start: an address without an API key, a port in use."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """Other machines may reach any address but loopback: then every request must carry a key."""
    if not is_loopback(host) and not api_key:
        raise ServeError(f"serving on {host} lets other machines in: it needs an API key (--api-key KEY)")


def check_address(host: object, port: object) -> None:
    """A host name and a TCP port (0: any free one), before a socket is touched."""
    if not isinstance(host, str) or not host or not host.isprintable() or len(host) > 255:
        raise ServeError(f"the host to listen on must be an address or a name, got {host!r:.60}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ServeError(f"the port must be a whole number from 0 to 65535, got {port!r:.60}")


class ServerThread:
    def __init__(self, server: OpenAIServer, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
        check_address(host, port)
        check_bind(host, server.api_key)
        self.server, self.host, self.port = server, host, port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Listen (port 0: any free port, then `port` says which); ServeError if it cannot."""
        self._thread = threading.Thread(target=self._main, name="lanechat-server", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def stop(self) -> None:
        """End the open streams with an error event, close the sockets, join the thread."""
        loop, stop = self._loop, self._stop
        if self._thread is None or loop is None or stop is None or not self._thread.is_alive():
            return
        loop.call_soon_threadsafe(stop.set)
        self._thread.join()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop, self._stop = loop, asyncio.Event()
        runner = web.AppRunner(self.server.app(), handler_cancellation=True, access_log=None,
                               shutdown_timeout=SHUTDOWN_S)
        try:
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
        except Exception as e:  # noqa: BLE001 - start() waits for _ready: no error may leave it unset
            why = e.strerror or e if isinstance(e, OSError) else f"{type(e).__name__}: {e}"
            self._error = ServeError(f"cannot listen on {self.host}:{self.port}: {why}")
            loop.run_until_complete(runner.cleanup())
            loop.close()
            self._ready.set()
            return
        self.port = runner.addresses[0][1]
        self._ready.set()
        loop.run_until_complete(self._stop.wait())
        self.server.end_streams(None, "the server is shutting down")
        loop.run_until_complete(runner.cleanup())
        loop.close()
