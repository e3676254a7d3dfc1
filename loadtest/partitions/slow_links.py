"""A store node's slow, lossy links: delay by Shopify's toxiproxy in front of its ports, loss by the kernel.

toxiproxy (``loadtest/partitions/toxiproxy/go.mod``, built into the venv by ``./dev test``) runs in the node's
namespace with a proxy in front of each of its ports; nftables redirects the connections that come from other
namespaces to the proxies from the start, so that the router's pooled connections go through them too, and the
proxies pass everything through until a fault adds a ``latency`` toxic. toxiproxy relays TCP streams, where a lost
packet is only a retransmission's delay, so loss is made where packets are: an nftables rule on the node's interface
drops a share of them at random (``numgen random``) both ways.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from loadtest.partitions.network import NetworkError, run_ip
from tools.local.services import Service, wait_for_port

API_PORT = 8474
PROXY_OFFSET = 10_000  # the proxy in front of port p listens on p + this
_LOSS_TABLE = "freshroute_loss"
_PROXIED_TABLE = "freshroute_proxied"


def toxiproxy_binary() -> Path:
    return Path(sys.executable).parent / "toxiproxy-server"


class SlowLinks:
    """The proxies of one node (namespace ``ns``, address ``address``) in front of ``ports``."""

    def __init__(self, ns: str, address: str, ports: dict[str, int], log: Path) -> None:
        self.ns = ns
        self.address = address
        self.ports = ports
        self.log = log
        self._proxy: Service | None = None
        self._api = f"http://{address}:{API_PORT}"

    def start(self) -> None:
        """Start toxiproxy, make a proxy per port and send the node's incoming connections through them."""
        binary = toxiproxy_binary()
        if not binary.exists():
            raise FileNotFoundError(f"{binary} is missing: `./dev test` builds it (loadtest/partitions/toxiproxy)")
        with open(self.log, "ab") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", self.ns, str(binary), "-host", self.address,
                                     "-port", str(API_PORT)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env={**os.environ, "LOG_LEVEL": "warn"})
        self._proxy = Service("toxiproxy", proc, f"{self.address}:{API_PORT}")
        wait_for_port(self.address, API_PORT, 10, proc)
        with httpx.Client(base_url=self._api, timeout=2) as api:
            for name, port in self.ports.items():
                api.post("/proxies", json={"name": name, "listen": f"{self.address}:{port + PROXY_OFFSET}",
                                           "upstream": f"{self.address}:{port}", "enabled": True}).raise_for_status()
        redirects = " ".join(f"tcp dport {port} redirect to :{port + PROXY_OFFSET};" for port in self.ports.values())
        # prerouting sees only what arrives from other namespaces: the proxies' own upstream connections are local.
        run_ip("nft", "-f", "-", ns=self.ns, stdin=f"table ip {_PROXIED_TABLE} {{\n  chain prerouting {{ type nat "
                                                    f"hook prerouting priority dstnat; {redirects} }}\n}}\n")

    def slow(self, delay_ms: int, loss_percent: int) -> None:
        with httpx.Client(base_url=self._api, timeout=2) as api:
            for name in self.ports:
                for stream in ("upstream", "downstream"):
                    api.post(f"/proxies/{name}/toxics", json={
                        "name": f"delay_{stream}", "type": "latency", "stream": stream, "toxicity": 1.0,
                        "attributes": {"latency": delay_ms // 2, "jitter": 0}}).raise_for_status()
        if loss_percent:
            drop = f"numgen random mod 100 < {loss_percent} drop;"
            run_ip("nft", "-f", "-", ns=self.ns, stdin=(
                f"table inet {_LOSS_TABLE} {{\n"
                f"  chain input {{ type filter hook input priority 0; iifname \"eth0\" {drop} }}\n"
                f"  chain output {{ type filter hook output priority 0; oifname \"eth0\" {drop} }}\n}}\n"))

    def heal(self) -> None:
        try:
            run_ip("nft", "delete", "table", "inet", _LOSS_TABLE, ns=self.ns)
        except NetworkError:
            pass  # no loss was added
        with httpx.Client(base_url=self._api, timeout=2) as api:
            for name in self.ports:
                for stream in ("upstream", "downstream"):
                    api.delete(f"/proxies/{name}/toxics/delay_{stream}")

    def stop(self) -> None:
        """Stop the proxies and the redirect to them: the namespace may host the node of another stack next."""
        try:
            run_ip("nft", "delete", "table", "ip", _PROXIED_TABLE, ns=self.ns)
        except NetworkError:
            pass  # never made (the run ended before)
        if self._proxy is not None:
            self._proxy.stop(10)
            self._proxy = None
