"""The router's compiled lookup path (native/dataplane), as router/data_plane.py uses it."""

from typing import Any

class Front:
    """The compiled REST front of one router process."""

    def __init__(self, listen_fd: int, python_port: int, config: str, grpc: tuple[int, int] | None = None) -> None:
        """``listen_fd``: the REST port's listening socket (kept open by the caller until :meth:`stop` returns);
        ``python_port``: the loopback port of the router's Python front; ``config``: the routing settings as JSON;
        ``grpc``: the gRPC port's listening socket and the loopback port of the Python gRPC front, when the path
        answers ``Router.Get`` too."""
    def update(self, doc: bytes) -> None:
        """Swap in a new routing view (router.data_plane.snapshot_doc); a malformed one is a ValueError."""
    def principals(self, doc: bytes) -> None:
        """Swap in the principals tokens are judged by (router.data_plane.principals_doc); malformed: ValueError."""
    def tls(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Speak TLS on the ports with this chain and key from now on (new handshakes); unusable: ValueError."""
    def cluster_tls(self, ca_pem: bytes, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> None:
        """Reach store nodes over TLS trusting ``ca_pem``, presenting ``cert_pem``/``key_pem`` where asked; call before
        :meth:`start`; unusable files: ValueError."""
    def rates(self) -> dict[str, tuple[int, int]]:
        """Each rated principal's (reads leased and not spent, its lookups asked here since the last call)."""
    def grant(self, name: str, tokens: int) -> bool:
        """Add ``tokens`` leased reads to principal ``name`` (False if it has no rate here any more)."""
    def start(self, threads: int) -> None:
        """Serve on ``threads`` threads, each accepting on the listening socket."""
    def stop(self, grace_s: float) -> None:
        """Stop accepting; connections close once idle, and those open after ``grace_s`` are dropped."""
    def counts(self) -> dict[str, Any]:
        """Lookups answered by outcome and role, latency buckets, hedges, requests relayed, connections handed over,
        gRPC calls relayed, connections accepted on each port."""

def tls_problem(cert_pem: bytes, key_pem: bytes) -> str | None:
    """What keeps rustls from serving this certificate chain and key, or None."""

def cluster_tls_problem(ca_pem: bytes, cert_pem: bytes | None = None, key_pem: bytes | None = None) -> str | None:
    """What keeps rustls from reaching store nodes with these files, or None."""

def order(doc: bytes, config: str, table: str, partition: int, max_lag: int | None, max_staleness_ms: int | None,
          min_offset: int, now_ms: int) -> list[str]:
    """The nodes of a partition's replicas in the order the path would ask them (no load, no answers seen)."""


class DirectReads:
    """A client's direct key reads on the compiled path, with no I/O of its own (freshroute.client.compiled drives
    it): the caller's asyncio loop owns the read ports' transports and the one timer."""

    due: float | None
    """When the caller's timer is due (loop time), while a lookup waits on one."""

    def __init__(self, config: str, lookup_cls: type) -> None:
        """``config``: the routing policy as JSON (freshroute.routing.compiled_view.policy_doc); ``lookup_cls``: the
        named tuple answers are made as."""

    def update(self, doc: bytes) -> None:
        """Swap in a new routing view (freshroute.routing.compiled_view.snapshot_doc)."""

    def connected(self, address: str, transport: Any) -> None:
        """The read port at ``address`` is reached by ``transport`` (an asyncio transport) from now on."""

    def reaches(self, address: str) -> bool:
        """Whether a transport to ``address`` is known."""

    def get(self, table: str, physical: str, key: str, max_lag: int | None, max_staleness_ms: int | None,
            position: tuple[str, dict[int, int]] | None, fut: Any, now: float) -> int:
        """Read ``key``; flags SERVED (1: ``fut`` resolves to a Lookup, or None for the Python path), FLUSH (2: call
        :meth:`flush` soon), TIMER (4: arm the timer at :attr:`due`); 0: the Python path reads it."""

    def get_many(self, table: str, physical: str, keys: list[str], max_lag: int | None, max_staleness_ms: int | None,
                 position: tuple[str, dict[int, int]] | None, fut: Any, now: float) -> int:
        """Read ``keys``, one group per partition: ``fut`` resolves to their Lookups in order, or None for the Python
        path; flags as :meth:`get`'s (0: some partition has no replica this path reaches, and nothing was sent)."""

    def flush(self) -> None:
        """Write every outbox's reads, one batch per node."""

    def received(self, address: str, data: bytes, now: float) -> int:
        """Bytes from the read port at ``address``; flags as :meth:`get`'s."""

    def lost(self, address: str, why: str | None = None, now: float = 0.0) -> int:
        """The read port at ``address`` is gone: its attempts in flight failed; flags as :meth:`get`'s."""

    def expire(self, now: float) -> int:
        """The timer fired: hedges due leave, lookups past their deadline resolve to None; flags as :meth:`get`'s."""

    def in_flight(self) -> int:
        """Lookups in flight."""

    def hedges(self) -> int:
        """Hedges sent so far."""
