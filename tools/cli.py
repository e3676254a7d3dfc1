"""The one entry point: ``freshroute <command>``.

Each component runs as its own process (``broker``, ``pipeline``, ``store-node``,
``router``); ``local up|status|down`` runs the whole embedded stack for a demo; ``lookup``
asks a router for a key. Component flags are generated from the component's typed
settings, so every setting is a flag (``--node-id``) and an environment variable
(``FRESHROUTE_NODE_ID``), and a wrong value fails naming the key.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from freshroute.errors import ConfigError, FreshrouteError
from freshroute.launch import add_settings_flags, start, stopped
from tools.durations import duration_arg

if TYPE_CHECKING:
    from freshroute.bound import Bound

# command → (settings class, run function), imported lazily: the router should not pay
# for importing pyspark, nor the pipeline for FastAPI.
COMPONENTS: dict[str, tuple[str, str, str]] = {
    "pipeline": ("pipeline.settings:PipelineSettings", "pipeline.job:run", "Run the streaming pipeline (tables → changelogs)."),
    "store-node": ("store_node.settings:StoreNodeSettings", "store_node.node:run", "Run a store node (changelogs → RocksDB, internal gRPC)."),
    "router": ("router.settings:RouterSettings", "router.main:run", "Run the router (REST + gRPC)."),
}


def _server_not_installed(command: str, missing: str) -> ConfigError:
    """What a client-only install says when asked to run a part of the server."""
    return ConfigError(f"`freshroute {command}` needs the server install ({missing}): "
                       "pip install 'freshroute[server]'", setting="install")


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _run_component(command: str, args: argparse.Namespace) -> int:
    settings_ref, run_ref, _ = COMPONENTS[command]
    start(_resolve(settings_ref), _resolve(run_ref), args)
    return 0


def _run_broker(args: argparse.Namespace) -> int:
    from tools.local.broker import BrokerNode, Quorum, prepare

    node = BrokerNode(args.node_id, args.host, args.port, args.controller_port or args.port + 1, Path(args.home))
    quorum = Quorum.alone(node, args.cluster_id)
    if args.voters:
        quorum = Quorum(quorum.cluster_id, args.voters, args.bootstrap or node.address, len(args.voters.split(",")))
    cmd = prepare(node, quorum)
    os.execv(cmd[0], cmd)  # the broker is the process: signals reach it directly


def _lookup_any(args: argparse.Namespace) -> int:
    """``freshroute lookup``: its table, key and bound checked here as a router would (the error body on stderr,
    exit 1), then asked through the client, gRPC or REST."""
    import json

    from freshroute.bound import Bound
    from freshroute.keys import key_bytes

    if (args.as_of is not None or args.versions) and (args.direct or args.grpc or args.last):
        raise SystemExit("freshroute lookup: --as-of and --versions ask a router's REST API: leave out --direct, "
                         "--grpc and --last (the client's get(as_of=) and versions() do the same)")
    try:
        key_bytes(args.table, "table")
        key_bytes(args.key, "key")
        bound = Bound.parse(vars(args))
    except FreshrouteError as e:
        print(json.dumps(e.to_body(), separators=(",", ":")), file=sys.stderr)
        return 1
    return _lookup_direct(args, bound) if args.direct else _lookup_grpc(args, bound) if args.grpc else \
        _lookup(args, bound)


def _lookup(args: argparse.Namespace, bound: "Bound") -> int:
    import urllib.error
    import urllib.parse
    import urllib.request

    params: dict[str, Any] = bound.to_query()
    url = (f"{args.router.rstrip('/')}/v1/tables/{urllib.parse.quote(args.table, safe='')}/keys/"
           f"{urllib.parse.quote(args.key, safe='')}")
    span = None if args.versions else _window_span(args)
    if args.versions:
        url += "/versions"
        params.update({k: v for k, v in (("from", args.from_ms), ("to", args.to_ms)) if v is not None})
    elif args.as_of is not None:
        params["as_of"] = args.as_of
    if span is not None:
        url += "/windows"
        params.update({"from": span[0], "to": span[1]})
    if params:
        url += "?" + urllib.parse.urlencode(params)
    request = urllib.request.Request(url, headers=_auth_headers(args))
    try:
        with urllib.request.urlopen(request, timeout=_timeout_s(bound), context=_tls_context(args)) as resp:
            print(resp.read().decode())
            return 0
    except urllib.error.HTTPError as e:
        print(e.read().decode(), file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"router at {args.router} is not reachable: {e.reason}", file=sys.stderr)
        return 2


def _window_span(args: argparse.Namespace) -> tuple[int, int] | None:
    """The window starts a lookup asks for: ``--last`` (up to now), or ``--from``/``--to``; None: a key lookup."""
    if args.last is not None:
        import time

        from freshroute.windows import duration_ms

        try:
            last = duration_ms(args.last, "--last")
        except ValueError as e:
            raise SystemExit(f"freshroute lookup: {e}") from None
        now = int(time.time() * 1000)
        return now - last, now + 1
    if args.from_ms is not None or args.to_ms is not None:
        if args.from_ms is None or args.to_ms is None:
            raise SystemExit("freshroute lookup: --from and --to go together (or use --last)")
        try:
            return int(args.from_ms), int(args.to_ms)
        except ValueError:
            raise SystemExit(f"freshroute lookup: --from and --to are milliseconds since the epoch, not "
                             f"{args.from_ms!r} and {args.to_ms!r}") from None
    return None


def _auth_headers(args: argparse.Namespace) -> dict[str, str]:
    return {"Authorization": f"Bearer {args.token}"} if args.token else {}


def _tls_context(args: argparse.Namespace) -> Any:
    """The TLS context of --ca (trust) and --cert/--key (a client certificate, for mTLS); None: the defaults."""
    from freshroute.tls import ClientTLS

    return ClientTLS(args.ca, args.tls_cert, args.tls_key).context()


def _timeout_s(bound: "Bound") -> float:
    """How long a lookup from the command line waits for its answer: 10 s, or longer than it may wait for events."""
    return max(10.0, (bound.wait_ms or 0) / 1000 + 5)


def _lookup_grpc(args: argparse.Namespace, bound: "Bound") -> int:
    import json

    import grpc

    from freshroute.routing.results import lag_message_doc, served_doc
    from freshroute.tls import ClientTLS
    from proto import router_pb2, router_pb2_grpc
    from router.bound_message import bound_message

    tls = ClientTLS(args.ca, args.tls_cert, args.tls_key)
    if tls.enabled:
        channel = grpc.secure_channel(args.grpc, tls.grpc_credentials())
    else:
        channel = grpc.insecure_channel(args.grpc)
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    span = _window_span(args)
    with channel:
        try:
            stub = router_pb2_grpc.RouterStub(channel)
            if span is not None:
                w = stub.GetWindows(router_pb2.WindowsRequest(table=args.table, key=args.key, from_ms=span[0],
                                                              to_ms=span[1], bound=bound_message(bound)),
                                    timeout=_timeout_s(bound), metadata=metadata)
            else:
                resp = stub.Get(router_pb2.GetRequest(table=args.table, key=args.key, bound=bound_message(bound)),
                                timeout=_timeout_s(bound), metadata=metadata)
        except grpc.RpcError as e:
            trailer = dict(e.trailing_metadata() or ()).get("freshroute-error")
            if trailer is None and e.code() is grpc.StatusCode.UNAVAILABLE:
                # No answer from freshroute at all, as REST's unreachable router.
                print(f"router at {args.grpc} is not reachable: {e.details()}", file=sys.stderr)
                return 2
            print(trailer or f"{e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    # The REST answer's shape, so that both ways print the same (protobuf's JSON would drop a
    # lag of zero and print offsets as strings).
    if span is not None:
        print(json.dumps({"table": w.table, "key": w.key, "windows": [
            {"start": x.start_ms, "end": x.end_ms, "value": json.loads(x.value_json), "final": x.final}
            for x in w.windows], "partition": w.partition,
            **served_doc(w.served_by.node, w.served_by.role, *lag_message_doc(w.lag).values(), w.position),
            "watermark_ms": w.watermark_ms if w.HasField("watermark_ms") else None}, separators=(",", ":")))
        return 0
    print(json.dumps({"table": resp.table, "key": resp.key, "value": json.loads(resp.value_json),
                      "partition": resp.partition,
                      **served_doc(resp.served_by.node, resp.served_by.role, *lag_message_doc(resp.lag).values(),
                                   resp.position)}, separators=(",", ":")))
    return 0


def _lookup_direct(args: argparse.Namespace, bound: "Bound") -> int:
    import base64
    import json

    from freshroute.client import Client
    from freshroute.cluster_access import read_secrets
    from freshroute.routing.results import served_doc

    client = None
    try:
        secret = read_secrets(args.cluster_secret_file)[0] if args.cluster_secret_file else None
        with Client(redis_url=args.redis_url, router=args.router, namespace=args.namespace,
                    redis_sentinels=args.redis_sentinels, redis_master_name=args.redis_master_name,
                    token=args.token, ca=args.ca, cert=args.tls_cert, key=args.tls_key, cluster_secret=secret,
                    connect_timeout_s=3.0) as client:
            span = _window_span(args)
            if span is not None:
                w = client.windows(args.table, args.key, from_ms=span[0], to_ms=span[1], bound=bound)
                print(json.dumps({"table": w.table, "key": w.key, "windows": [x._asdict() for x in w.windows],
                                  "partition": w.partition,
                                  **served_doc(w.node, w.role, w.lag_offsets, w.lag_ms, w.position),
                                  "watermark_ms": w.watermark_ms}, separators=(",", ":")))
                return 0
            r = client.get(args.table, args.key, bound=bound)
    except FreshrouteError as e:
        body = e.to_body()
        if client is not None and client.fallback_cause:
            # The router's answer is the fallback's: what kept the read from the store nodes is said beside it.
            body["error"]["direct_failure"] = client.fallback_cause
        print(json.dumps(body, separators=(",", ":"), default=str), file=sys.stderr)
        return 2 if e.code == "REPLICA_UNAVAILABLE" else 1
    if client.fallback_cause:
        print(f"freshroute: the store nodes were not read ({client.fallback_cause}); the router at {args.router} "
              f"answered", file=sys.stderr)
    value = {"value_b64": base64.b64encode(r.raw_value).decode()} if r.found and r.value_format == "bytes" \
        else {"value": r.value}
    doc = {"table": r.table, "key": r.key, **value, "partition": r.partition,
           **served_doc(r.node, r.role, r.lag_offsets, r.lag_ms, r.position)}
    if not r.found:
        doc = {"error": {"code": "KEY_NOT_FOUND", "message": f"key {r.key!r} not found in table {r.table!r}",
                         **{k: v for k, v in doc.items() if k != "value"}}}
    print(json.dumps(doc, separators=(",", ":")), file=sys.stdout if r.found else sys.stderr)
    return 0 if r.found else 1


def _table(args: argparse.Namespace) -> int:
    """``freshroute table add|list|remove``: compacted topics served as they are (freshroute/served_tables.py);
    ``switch|rollback``: which version of a table is served (tools/versions_cli.py); ``progress``: a version building
    followed (tools/progress_cli.py)."""
    import json

    from dataclasses import replace

    from redis import RedisError

    from freshroute.errors import RetryableError
    from freshroute.metadata.store import MetadataStore
    from freshroute.metadata.table_versions import served_specs
    from freshroute.metadata.version_store import TableVersionStore
    from freshroute.served_tables import add_table, describe, remove_table

    # Given before or after the table command, or neither (argparse's parents share their defaults, so they are here).
    args.redis_url = getattr(args, "redis_url", None) or os.environ.get("FRESHROUTE_REDIS_URL",
                                                                        "redis://127.0.0.1:16379/0")
    args.namespace = getattr(args, "namespace", None) or os.environ.get("FRESHROUTE_NAMESPACE", "freshroute")
    metadata = MetadataStore.from_url(args.redis_url, args.namespace, timeout_s=5.0)
    try:
        metadata.redis.ping()
    except RedisError as e:
        raise RetryableError(f"the metadata store at {args.redis_url} (--redis-url) does not answer: {e}",
                             setting="redis_url") from None
    if args.table_command == "list":
        from freshroute.lag import now_ms
        from freshroute.metadata.catch_up import version_figures
        from tools.progress_cli import version_lines

        records = TableVersionStore(metadata.redis, args.namespace).records()
        specs, lags, ends, now = metadata.tables(), metadata.input_lags(), metadata.input_ends(), now_ms()
        # A version's own table is shown as a version of its table (its state in the version column).
        listed = sorted(served_specs(specs, records, lambda spec, name: replace(spec, name=name)).items())
        # Each version with its input lag and, building, its progress and when it will have caught up.
        tables = [describe(spec, records.get(name),
                           *(version_figures(records[name], specs, lags, ends, now) if name in records else ()))
                  for name, spec in listed]
        if args.json:
            print(json.dumps({"tables": tables}, separators=(",", ":")))
            return 0
        print(f"{'table':<24} {'origin':<9} {'version':<24} {'partitions':>10} {'standbys':>8}  {'key':<7} "
              f"{'value':<7} topic")
        for (name, _), t in zip(listed, tables):
            version = records[name].summary() if name in records else "1"
            print(f"{t['name']:<24} {t['origin']:<9} {version:<24} {t['partitions']:>10} {t['standby_replicas']:>8}  "
                  f"{t['key_format']:<7} {t['value_format']:<7} {t['topic']}")
            for line in version_lines(t):
                print(f"  {line}")
        return 0
    if args.table_command in ("switch", "rollback", "progress"):
        from tools import versions_cli

        return versions_cli.run(args, metadata)
    if args.table_command == "remove":
        spec = remove_table(metadata, args.name)
        print(f"table {spec.name} removed: store nodes let its replicas go at their next assignment; "
              f"topic {spec.topic} is untouched")
        return 0
    if args.table_command == "deploy":
        from tools import deploy_cli

        return deploy_cli.run(args, metadata)
    from confluent_kafka.admin import AdminClient

    from freshroute.settings import kafka_client_config

    admin = AdminClient(kafka_client_config(args.bootstrap_servers))
    spec, warnings = add_table(metadata, admin, args.bootstrap_servers, args.name, args.topic,
                               key_format=args.key_format, value_format=args.value_format,
                               standby_replicas=args.standby_replicas, allow_uncompacted=args.allow_uncompacted,
                               history_retention_ms=args.history_retention,
                               kafka_config=kafka_client_config(args.bootstrap_servers))
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    history = f", history kept {spec.history_retention_ms} ms" if spec.versioned else ""
    print(f"table {spec.name} added: topic {spec.topic}, {spec.partitions} partitions, keys {spec.key_format}, "
          f"values {spec.value_format}, {spec.standby_replicas} standby(s){history}. Store nodes restore it now; "
          f"`freshroute lookup {spec.name} KEY` once they have.")
    return 0


def _bench(bench_args: list[str]) -> int:
    import subprocess

    # The benchmarks stand on the tools (the local stack), not under them: run as their own program.
    return subprocess.call([sys.executable, "-m", "loadtest.bench", *bench_args])


def _version() -> str:
    """The installed distribution's version (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("freshroute")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="freshroute", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"freshroute {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    broker = sub.add_parser("broker", help="Run Apache Kafka (KRaft, broker and controller in one) with its data under --home.")
    broker.add_argument("--home", default=".freshroute/broker", help="its config and data (formatted on first start)")
    broker.add_argument("--host", default="127.0.0.1")
    broker.add_argument("--port", type=int, default=19092, help="the client listener")
    broker.add_argument("--controller-port", type=int, default=0, help="the KRaft controller listener (default: port + 1)")
    broker.add_argument("--node-id", type=int, default=1)
    broker.add_argument("--voters", default="", metavar="ID@HOST:PORT,...",
                        help="every controller of the quorum (default: this node alone)")
    broker.add_argument("--bootstrap", default="", help="with --voters: every broker's client address")
    broker.add_argument("--cluster-id", default="", help="the quorum's id (default: the storage's, else a new one)")

    for command, (settings_ref, _, help_text) in COMPONENTS.items():
        p = sub.add_parser(command, help=help_text)
        try:
            add_settings_flags(p, _resolve(settings_ref))
        except ImportError as e:  # a client-only install: the server's dependencies are missing
            p.set_defaults(import_error=str(e))

    local = sub.add_parser("local", help="The embedded local stack with demo data.")
    local_sub = local.add_subparsers(dest="local_command", required=True)
    from tools.local import stack

    stack.add_arguments(local_sub)

    lookup = sub.add_parser("lookup", help="Look up one key through a router's REST API.")
    lookup.add_argument("table")
    lookup.add_argument("key")
    lookup.add_argument("--router", default=os.environ.get("FRESHROUTE_ROUTER_URL", "http://127.0.0.1:8080"))
    from freshroute.bound import PARAMETERS

    for name, parameter in PARAMETERS.items():  # the bound's parameters, as it defines them
        lookup.add_argument("--" + name.replace("_", "-"), dest=name, help=parameter.doc)
    lookup.add_argument("--last", metavar="DURATION",
                        help="a windowed table: the key's windows that started in the last DURATION (e.g. 1m)")
    lookup.add_argument("--from", dest="from_ms", metavar="MS", help="a windowed table: earliest window start (ms)")
    lookup.add_argument("--to", dest="to_ms", metavar="MS", help="a windowed table: latest window start (ms, exclusive)")
    lookup.add_argument("--as-of", dest="as_of", metavar="TIME",
                        help="a versioned table: the key's value at TIME (ms since the epoch, or RFC 3339 such as "
                             "2026-11-29T10:00:00Z)")
    lookup.add_argument("--versions", action="store_true",
                        help="a versioned table: the key's versions, newest first (--from/--to: valid in that range)")
    lookup.add_argument("--grpc", metavar="HOST:PORT", help="use the router's gRPC API at this address instead of REST")
    lookup.add_argument("--direct", action="store_true",
                        help="read the store nodes directly (freshroute.client), metadata from --redis-url; "
                             "the router is the fallback")
    lookup.add_argument("--token", default=os.environ.get("FRESHROUTE_TOKEN"),
                        help="bearer token for a router with an auth file (env FRESHROUTE_TOKEN)")
    lookup.add_argument("--ca", help="PEM CA certificate to trust for a router with TLS (https:// --router); "
                                     "with --direct, for the store nodes too")
    lookup.add_argument("--cert", dest="tls_cert", help="PEM client certificate, for a router (and with --direct, "
                                                        "store nodes) requiring one (mTLS)")
    lookup.add_argument("--key", dest="tls_key", help="PEM private key of --cert")
    lookup.add_argument("--cluster-secret-file", default=os.environ.get("FRESHROUTE_CLUSTER_SECRET_FILE"),
                        help="with --direct: present the cluster secret (the file's first line) to store nodes")
    lookup.add_argument("--redis-url", default=os.environ.get("FRESHROUTE_REDIS_URL", "redis://127.0.0.1:16379/0"))
    lookup.add_argument("--redis-sentinels", default=os.environ.get("FRESHROUTE_REDIS_SENTINELS"), metavar="HOST:PORT,...",
                        help="with --direct: find the metadata store through Redis Sentinel (with --redis-master-name)")
    lookup.add_argument("--redis-master-name", default=os.environ.get("FRESHROUTE_REDIS_MASTER_NAME"))
    lookup.add_argument("--namespace", default=os.environ.get("FRESHROUTE_NAMESPACE", "freshroute"))

    # The metadata store's flags, taken before or after the table command (`table add … --redis-url …`).
    metadata_flags = argparse.ArgumentParser(add_help=False)
    metadata_flags.add_argument("--redis-url", default=argparse.SUPPRESS,
                                help="the metadata store (env FRESHROUTE_REDIS_URL)")
    metadata_flags.add_argument("--namespace", default=argparse.SUPPRESS, help="env FRESHROUTE_NAMESPACE")
    table = sub.add_parser("table", help="Serve a compacted topic you already have as a table; list and remove "
                                         "such tables.", parents=[metadata_flags])
    table_sub = table.add_subparsers(dest="table_command", required=True)
    add = table_sub.add_parser("add", help="Register TOPIC as table NAME: store nodes restore it with no restart.",
                               parents=[metadata_flags])
    add.add_argument("name")
    add.add_argument("--topic", required=True)
    add.add_argument("--key-format", choices=("string", "json", "bytes"), default="string",
                     help="how the topic's keys are written; lookups name json keys by their JSON text and bytes "
                          "keys in base64url")
    add.add_argument("--value-format", choices=("json", "string", "bytes"), default="json",
                     help="how its values are written; bytes are served as value_b64 (REST), value_bytes (gRPC)")
    add.add_argument("--standby-replicas", type=int, default=1)
    add.add_argument("--history-retention", type=duration_arg("--history-retention", positive=True), default=0,
                     metavar="DURATION",
                     help="keep every version of a key this long after it was replaced (e.g. 7d), for lookups as of "
                          "a past time (?as_of=) and a key's versions; default: only the latest")
    add.add_argument("--allow-uncompacted", action="store_true",
                     help="serve a topic whose cleanup.policy is not compact (its deleted records vanish from restores)")
    add.add_argument("--bootstrap-servers", default=os.environ.get("FRESHROUTE_BOOTSTRAP_SERVERS", "127.0.0.1:19092"))
    table_list = table_sub.add_parser("list", help="Every table: the pipeline's and the topics served as they are.",
                                      parents=[metadata_flags])
    table_list.add_argument("--json", action="store_true")
    remove = table_sub.add_parser("remove", help="Stop serving a table added with `table add` (its topic stays).",
                                  parents=[metadata_flags])
    remove.add_argument("name")
    from tools import versions_cli

    versions_cli.add_parsers(table_sub, metadata_flags)
    from tools import deploy_cli

    deploy_cli.add_parser(table_sub, metadata_flags)

    # Its options are the benchmark's own (see main): this entry only documents the command.
    sub.add_parser("bench", help="Side-by-side benchmarks against the local stack (last line: JSON).", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        # argparse cannot pass options such as --home through to a REMAINDER positional,
        # so the benchmark parses its own arguments.
        return _bench(argv[1:])
    args = build_parser().parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "broker": _run_broker,
        "lookup": _lookup_any,
        "table": _table}
    try:
        if args.command in COMPONENTS:
            if getattr(args, "import_error", None):
                raise _server_not_installed(args.command, args.import_error)
            return _run_component(args.command, args)
        try:
            if args.command == "local":
                from tools.local import stack

                return stack.dispatch(args)
            return handlers[args.command](args)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] in ("freshroute", "pipeline", "store_node", "router", "loadtest", "proto"):
                raise
            raise _server_not_installed(args.command, str(e)) from None
    except FreshrouteError as e:  # a component stopped for a reason it has named (config, lost data …)
        return stopped(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`... | head`): nothing more can be said, and saying nothing at
        # exit needs stdout pointed somewhere that takes it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
