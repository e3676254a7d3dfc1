"""Wiring of the router process: one event loop serving REST and gRPC over one :class:`Router`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from functools import partial
from typing import Any, Callable, Iterator

import uvicorn

from freshroute.settings import is_loopback
from router.auth import Guard
from router.data_plane import DataPlane, why_not
from router.grpc_server import PublicGrpc
from router.rest.routes import KeyHandlers
from router.rate_limit import SharedRates
from router.rest.app import create_app
from router.runtime import RouterRuntime
from router.settings import RouterSettings
from router.transports.http1 import httptools_with_tls_extension, key_lookup_protocol

log = logging.getLogger("freshroute.router")


class _RestServer(uvicorn.Server):
    """uvicorn without its own signal handling: :func:`serve` stops REST and gRPC together."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _front_protocol(rest: uvicorn.Server) -> Callable[[], asyncio.Protocol] | None:
    """The Python front's protocol for a connection, as uvicorn makes one for each it accepts; None until it has
    started."""
    if not rest.started:
        return None
    config = rest.config
    return partial(config.http_protocol_class, config=config, server_state=rest.server_state,
                   app_state=rest.lifespan.state)


async def serve(settings: RouterSettings, stop: asyncio.Event | None = None) -> None:
    """Serve REST and gRPC until ``stop`` is set or SIGTERM/SIGINT arrives, then stop gracefully."""
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    runtime = RouterRuntime(settings)
    # Before anything listens: a broken auth file stops the start, naming the file and line.
    guard = Guard(settings.auth_file, SharedRates(runtime.redis, settings.namespace)) \
        if settings.auth_file is not None else None
    rest_tls, grpc_tls = settings.server_tls(("http/1.1",)), settings.server_tls(("h2",))
    if guard is None and not is_loopback(settings.host):
        log.warning("router bound to %s without --auth-file: anyone who reaches it reads every table", settings.host)
    rest_sock = _listen(settings.host, settings.rest_port, settings.reuse_port)
    compiled_not = why_not(settings, rest_tls)
    plane = DataPlane(settings, runtime.router.metrics, guard, rest_tls) if compiled_not is None else None
    # With the compiled path, the Python front serves the requests it leaves on a loopback port of its own, in plain
    # HTTP: the path terminates TLS.
    python_sock = _listen("127.0.0.1", 0) if plane is not None else rest_sock
    grpc_server: PublicGrpc | None = None
    grpc_sock: socket.socket | None = None
    rest_task: asyncio.Task[None] | None = None
    metrics: Any = None
    handled: list[int] = []
    try:
        await runtime.start()
        if settings.metrics_port is not None:
            from freshroute.prometheus import serve_metrics

            metrics = serve_metrics(runtime.router.metrics.registry, settings.host, settings.metrics_port)
            log.info("router metrics (this process's) on http://%s:%d/metrics", settings.host,
                     metrics.server_address[1])
        # With the compiled path, it owns the gRPC port too (the front of grpc.aio behind it, on loopback).
        if plane is not None and settings.grpc_front:
            try:
                grpc_sock = _listen(settings.host, settings.grpc_port, settings.reuse_port)
            except OSError as e:
                raise RuntimeError(f"cannot bind gRPC to {settings.host}:{settings.grpc_port}: {e}") from None
        grpc_server = PublicGrpc(settings, runtime.router, guard, grpc_tls, behind_compiled_path=grpc_sock is not None)
        grpc_port = await grpc_server.start()
        if grpc_sock is not None:
            grpc_port = grpc_sock.getsockname()[1]
        app = create_app(settings, runtime.router, guard=guard)
        # Key lookups are answered by the connection's own protocol (router.transports.http1); uvicorn's
        # serves everything else. No X-Forwarded-* rewriting: nothing here reads the client
        # address, and the middleware would inspect every request's headers.
        http = key_lookup_protocol(KeyHandlers(runtime.router, guard)) if settings.rest_fast_path \
            else httptools_with_tls_extension()
        config = uvicorn.Config(app, http=http, access_log=False, proxy_headers=False, server_header=False,
                                lifespan="on", log_level=settings.log_level.lower(),
                                timeout_graceful_shutdown=max(1, int(settings.graceful_shutdown_s)))
        if rest_tls is not None and plane is None:
            config.load()
            config.ssl = rest_tls.context  # ours, so that SIGHUP can reload it in place
        rest = _RestServer(config)
        rest_task = asyncio.create_task(rest.serve(sockets=[python_sock]), name="rest")
        if plane is not None:
            plane.start(rest_sock, python_sock.getsockname()[1], config.timeout_keep_alive,
                        runtime.router.metadata.current,
                        None if grpc_sock is None else (grpc_sock, grpc_server.port), partial(_front_protocol, rest))
            runtime.snapshot_listeners.append(plane.on_snapshot)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
                handled.append(sig)
        reloads = [x.reload for x in (guard, rest_tls, grpc_tls) if x is not None]
        if plane is not None and reloads:
            reloads.append(plane.reloaded)  # what the reloads before it loaded
        if reloads:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                # New principals and certificates for new requests and handshakes; connections stay open.
                loop.add_signal_handler(signal.SIGHUP, lambda: [reload() for reload in reloads])
                handled.append(signal.SIGHUP)
        rest_port = rest_sock.getsockname()[1]
        # Modules, the app and its routes live as long as the process: frozen, they are no
        # longer traced by every full collection. Lookups in flight keep a few hundred
        # objects alive at any time, which with the default threshold (700) set off a young
        # collection every few dozen lookups (~4% of the CPU under load); nearly all of
        # them are freed by reference counting anyway.
        gc.freeze()
        gc.set_threshold(10_000)
        log.info("router serving REST on %s://%s:%d and gRPC on %s:%d%s; REST lookups by the %s", "https" if rest_tls
                 else "http", settings.host, rest_port, settings.host, grpc_port,
                 " (TLS" + (", client certificates required)" if settings.tls_client_ca else ")") if rest_tls else "",
                 ("compiled path" + (" (gRPC's Router.Get too)" if grpc_sock is not None else "")) if plane is not None
                 else f"Python front ({compiled_not})")
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait({stop_wait, rest_task}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if rest_task.done():
            log.error("REST server ended on its own; stopping")
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)
        log.info("router stopping")
        runtime.router.stop_serving()
        if plane is not None:
            await asyncio.to_thread(plane.stop, settings.graceful_shutdown_s)
        if rest_task is not None:
            rest.should_exit = True
        if grpc_server is not None:
            await grpc_server.stop(settings.graceful_shutdown_s)
        if rest_task is not None:
            await asyncio.gather(rest_task, return_exceptions=True)
        rest_sock.close()
        python_sock.close()
        if grpc_sock is not None:
            grpc_sock.close()
        if metrics is not None:
            metrics.shutdown()
        await runtime.stop()
        log.info("router stopped")


def run(settings: RouterSettings) -> None:
    """Serve REST and gRPC in this process until SIGTERM/SIGINT (blocking)."""
    import uvloop

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvloop.run(serve(settings))
