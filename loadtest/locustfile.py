"""Locust users for freshroute: ``RestUser`` (HTTP), ``GrpcUser`` (gRPC ``Router.Get``) and ``ClientUser``
(:class:`freshroute.client.Client`, reading the store nodes directly; needs ``--redis-url``).

Both draw keys uniformly or zipf-skewed (hot keys) over ``{prefix}0 .. {prefix}{keys-1}`` and a
bound per request from a weighted mix: none, ``max_lag``, ``max_staleness_ms``, ``max_input_lag_ms``, or ``session``
(the user's latest positions passed back as ``min_position``: monotonic reads). gRPC calls fire
locust's ``request`` events, so the stats table, the CSV files and the web UI show them next to
the HTTP rows, one row per bound kind.

Headless, 30 s, 20 users (REST and gRPC half each), 10 lookups/s per user:

    .venv/bin/locust -f loadtest/locustfile.py --headless -u 20 -r 10 -t 30s \\
        --host http://127.0.0.1:8080 --grpc-target 127.0.0.1:50051 --csv reports/locust

Options (also as environment variables ``FRESHROUTE_LT_<NAME>``): ``--table``, ``--keys``,
``--key-prefix``, ``--key-dist uniform|zipf``, ``--zipf-s``, ``--bounds``, ``--user-rps``
(0 = no wait), ``--grpc-target``, ``--redis-url`` and ``--namespace`` (the client's metadata store),
``--max-run-time`` (a hard stop when ``-t`` is not given), ``--window-span`` (ms; a windowed ``--table``: each
lookup asks for the key's windows that started in that last span — ``/windows``, ``GetWindows``,
``Client.windows``).
Pick one kind of user by naming it: ``locust -f loadtest/locustfile.py RestUser …``.
"""

from __future__ import annotations

import os
import time

import grpc
import grpc.experimental.gevent as grpc_gevent
import orjson
from locust import HttpUser, User, constant_throughput, events, task

from loadtest.workload import DEFAULT_BOUND_MIX, BoundMixer, KeyChooser, Session, bound_params, parse_bound_mix
from proto import router_pb2, router_pb2_grpc

# grpcio blocks its calling thread; under gevent it must yield to the other users instead.
grpc_gevent.init_gevent()


def _env(name: str, default: str) -> str:
    return os.environ.get(f"FRESHROUTE_LT_{name.upper()}", default)


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    group = parser.add_argument_group("freshroute")
    group.add_argument("--table", default=_env("table", "sensor_stats"), help="table to look keys up in")
    group.add_argument("--keys", type=int, default=int(_env("keys", "100")), help="keyspace size")
    group.add_argument("--key-prefix", default=_env("key_prefix", "sensor-"))
    group.add_argument("--key-dist", choices=("uniform", "zipf"), default=_env("key_dist", "uniform"))
    group.add_argument("--zipf-s", type=float, default=float(_env("zipf_s", "1.1")), help="zipf exponent")
    group.add_argument("--bounds", default=_env("bounds", DEFAULT_BOUND_MIX),
                       help="weighted bound mix, e.g. none:4,max_lag=100:2,max_staleness_ms=5000:2,session:2")
    group.add_argument("--user-rps", type=float, default=float(_env("user_rps", "10")),
                       help="lookups per second per user; 0 = no wait")
    group.add_argument("--grpc-target", default=_env("grpc_target", "127.0.0.1:50051"), help="router gRPC host:port")
    group.add_argument("--redis-url", default=_env("redis_url", "redis://127.0.0.1:16379/0"),
                       help="metadata store of ClientUser's client")
    group.add_argument("--namespace", default=_env("namespace", "freshroute"), help="metadata namespace")
    group.add_argument("--window-span", type=int, default=int(_env("window_span", "0")),
                       help="ms: window lookups of a windowed --table, over that last span (0: key lookups)")
    group.add_argument("--max-run-time", type=float, default=float(_env("max_run_time", "600")),
                       help="seconds after which the test stops when -t/--run-time is not given")


@events.test_start.add_listener
def _bound_the_run(environment, **_kwargs) -> None:
    opts = environment.parsed_options
    if opts is None:
        return
    parse_bound_mix(opts.bounds)  # a bad mix fails the run at once, not in every user
    if not getattr(opts, "run_time", None) and environment.runner is not None:
        import gevent

        gevent.spawn_later(opts.max_run_time, environment.runner.quit)


class _Workload:
    """What the two users share: key choice, bound mix and the session's positions."""

    environment: object

    def _setup_workload(self, name: str) -> None:
        opts = self.environment.parsed_options
        self.table = opts.table
        self.chooser = KeyChooser.for_keyspace(opts.key_prefix, opts.keys, opts.key_dist, opts.zipf_s)
        self.mixer = BoundMixer(parse_bound_mix(opts.bounds))
        self.session = Session(name)
        self._pace = constant_throughput(opts.user_rps) if opts.user_rps > 0 else None
        self.window_span = opts.window_span

    def next_lookup(self) -> tuple[str, str, dict]:
        choice = self.mixer.choose()
        return self.chooser.choose(), choice.kind, bound_params(choice, self.session, self.table)

    def span(self) -> tuple[int, int] | None:
        """The window starts to ask for: the last ``--window-span`` ms (None: a key lookup)."""
        if not self.window_span:
            return None
        now = int(time.time() * 1000)
        return now - self.window_span, now + 1

    def wait_time(self) -> float:
        return self._pace(self) if self._pace else 0.0


class RestUser(_Workload, HttpUser):
    """``GET /v1/tables/{table}/keys/{key}``; 200 and KEY_NOT_FOUND count as success."""

    def on_start(self) -> None:
        self._setup_workload(f"rest-{id(self):x}")

    @task
    def lookup(self) -> None:
        key, kind, bound = self.next_lookup()
        path, span = f"/v1/tables/{self.table}/keys/{key}", self.span()
        if span is not None:
            path, bound = path + "/windows", {**bound, "from": span[0], "to": span[1]}
        with self.client.get(path, params=bound or None, catch_response=True,
                             name=f"GET /v1/tables/{self.table}/keys/[key]{'' if span is None else '/windows'} "
                                  f"({kind})") as resp:
            try:
                body = orjson.loads(resp.content) if resp.content else {}
            except orjson.JSONDecodeError:
                body = {}
            if resp.status_code == 200:
                self.session.observe(self.table, body.get("position"))
                resp.success()
                return
            err = body.get("error", {}) if isinstance(body, dict) else {}
            if resp.status_code == 404 and err.get("code") == "KEY_NOT_FOUND":
                self.session.observe(self.table, err.get("position"))
                resp.success()
            else:
                resp.failure(f"{resp.status_code} {err.get('code', '')}".strip())


class GrpcUser(_Workload, User):
    """``Router.Get`` over one channel per user, reported to locust as request type ``grpc``."""

    def on_start(self) -> None:
        self._setup_workload(f"grpc-{id(self):x}")
        self.channel = grpc.insecure_channel(self.environment.parsed_options.grpc_target)
        self.stub = router_pb2_grpc.RouterStub(self.channel)

    def on_stop(self) -> None:
        self.channel.close()

    @task
    def lookup(self) -> None:
        key, kind, bound = self.next_lookup()
        message = router_pb2.Bound(**bound) if bound else None
        span = self.span()
        start = time.perf_counter()
        exc: Exception | None = None
        length = 0
        try:
            if span is None:
                resp = self.stub.Get(router_pb2.GetRequest(table=self.table, key=key, bound=message), timeout=5)
            else:
                resp = self.stub.GetWindows(router_pb2.WindowsRequest(table=self.table, key=key, from_ms=span[0],
                                                                      to_ms=span[1], bound=message), timeout=5)
            length = resp.ByteSize()
            self.session.observe(self.table, resp.position)
        except grpc.RpcError as e:
            code = _error_code(e)
            if not (e.code() == grpc.StatusCode.NOT_FOUND and code == "KEY_NOT_FOUND"):
                exc = RuntimeError(f"{e.code().name} {code or ''}".strip())
        self.environment.events.request.fire(request_type="grpc",
                                             name=f"Router.{'Get' if span is None else 'GetWindows'} ({kind})",
                                             response_time=(time.perf_counter() - start) * 1000,
                                             response_length=length, exception=exc, context={})


class ClientUser(_Workload, User):
    """``freshroute.client.Client.get``, straight to the store nodes, reported to locust as request type ``client``.

    One client per locust process, shared by its users (the client is thread-safe and keeps
    its connections per greenlet's thread); the router given as ``--host`` is its fallback.
    """

    _client = None

    def on_start(self) -> None:
        self._setup_workload(f"client-{id(self):x}")
        if ClientUser._client is None:
            from freshroute.client import Client

            opts = self.environment.parsed_options
            ClientUser._client = Client(redis_url=opts.redis_url, router=self.host or None, namespace=opts.namespace)

    @task
    def lookup(self) -> None:
        from freshroute.errors import FreshrouteError

        key, kind, bound = self.next_lookup()
        start = time.perf_counter()
        exc: Exception | None = None
        span = self.span()
        try:
            if span is None:
                r = self._client.get(self.table, key, **bound)
            else:
                r = self._client.windows(self.table, key, from_ms=span[0], to_ms=span[1], **bound)
            self.session.observe(self.table, r.position)
        except FreshrouteError as e:
            exc = RuntimeError(e.code)
        self.environment.events.request.fire(request_type="client",
                                             name=f"Client.{'get' if span is None else 'windows'} ({kind})",
                                             response_time=(time.perf_counter() - start) * 1000,
                                             response_length=0, exception=exc, context={})


@events.quitting.add_listener
def _close_client(**_kwargs) -> None:
    if ClientUser._client is not None:
        ClientUser._client.close()
        ClientUser._client = None


def _error_code(e: grpc.RpcError) -> str | None:
    for k, v in (e.trailing_metadata() or ()):
        if k == "freshroute-error":
            try:
                return orjson.loads(v).get("error", {}).get("code")
            except (orjson.JSONDecodeError, AttributeError):
                return None
    return None
