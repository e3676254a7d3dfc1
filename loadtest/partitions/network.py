"""The partition harness's network: a namespace per place of the stack, each joined by a veth pair to a bridge in a
namespace of its own, and the cuts between two places as nftables rules inside one of them.

Nothing is made in the machine's own network: the bridge lives in the hub namespace and both ends of every veth pair
are created where they belong, so deleting the namespaces removes everything. Every name starts with the run's tag,
``frp<pid of the harness>``, so that :func:`sweep` can tell a dead run's leftovers from a live run's.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable

TAG_PREFIX = "frp"
PREFIX_LEN = 24  # the stack's addresses are a /24 (tools.local.stack.NETNS_SUBNET)
HARNESS_PLACE = "harness"
_TABLE = "freshroute_cut"


class NetworkError(RuntimeError):
    """A namespace, link or rule could not be made: the harness cannot run here (privileges, missing tools)."""


def run_ip(*args: str, ns: str | None = None, stdin: str | None = None) -> str:
    """Run ``ip`` (or, with ``ns``, any command inside namespace ``ns``); its stdout, or NetworkError with its words."""
    command = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, *args]
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise NetworkError(f"`{' '.join(command)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def why_not_here() -> str | None:
    """Why this process cannot make network namespaces and cut links between them, or None if it can."""
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"`{tool}` is missing (Debian's {package})"
    probe = f"{TAG_PREFIX}{os.getpid()}-probe"
    try:
        run_ip("netns", "add", probe)
        run_ip("netns", "del", probe)
    except NetworkError as e:
        return str(e)
    return None


@dataclass(frozen=True)
class Link:
    """Which packets between ``place`` and ``peer`` a cut drops: ``both`` ways, ``out`` (``place``'s packets to
    ``peer`` are lost: it hears the peer's answers to nothing) or ``in`` (the peer's packets to ``place`` are lost)."""

    place: str
    peer: str
    way: str = "both"

    def __post_init__(self) -> None:
        if self.way not in ("both", "out", "in"):
            raise ValueError(f"a cut goes both ways, out or in, not {self.way!r}")


class Network:
    """The namespaces of one run: ``places`` maps each namespace to its address; the harness gets one of its own."""

    def __init__(self, tag: str, places: dict[str, str], harness_address: str) -> None:
        self.tag = tag
        self.hub = f"{tag}-hub"
        self.places = {**places, self.harness: harness_address}
        self._made: list[str] = []
        self._cuts: dict[Link, str] = {}

    @property
    def harness(self) -> str:
        return f"{self.tag}-{HARNESS_PLACE}"

    def create(self, say: Callable[[str], None] = lambda _m: None) -> None:
        """Make the hub with its bridge and every place joined to it, loopback up in each."""
        run_ip("netns", "add", self.hub)
        self._made.append(self.hub)
        run_ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        run_ip("-n", self.hub, "link", "set", "br0", "up")
        for i, (ns, address) in enumerate(self.places.items()):
            run_ip("netns", "add", ns)
            self._made.append(ns)
            run_ip("-n", ns, "link", "set", "lo", "up")
            run_ip("link", "add", f"v{i}", "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", ns)
            run_ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0", "up")
            run_ip("-n", ns, "addr", "add", f"{address}/{PREFIX_LEN}", "dev", "eth0")
            run_ip("-n", ns, "link", "set", "eth0", "up")
        say(f"network: {len(self.places)} namespaces on a bridge in {self.hub}")

    def remove(self) -> None:
        """Delete every namespace this run made (their links and rules go with them)."""
        for ns in reversed(self._made):
            try:
                run_ip("netns", "del", ns)
            except NetworkError:
                pass  # already gone
        self._made.clear()
        self._cuts.clear()

    def address(self, place: str) -> str:
        return self.places[place]

    def cut(self, link: Link) -> None:
        """Drop the link's packets silently (as a partition does: no reset, the peer's packets vanish)."""
        if link in self._cuts:
            return
        peer = self.address(link.peer)
        chain = f"{_TABLE}_{len(self._cuts)}"
        rules = [f"table inet {chain} {{"]
        if link.way in ("both", "out"):
            rules.append(f"  chain output {{ type filter hook output priority 0; ip daddr {peer} drop; }}")
        if link.way in ("both", "in"):
            rules.append(f"  chain input {{ type filter hook input priority 0; ip saddr {peer} drop; }}")
        run_ip("nft", "-f", "-", ns=link.place, stdin="\n".join([*rules, "}", ""]))
        self._cuts[link] = chain

    def heal(self, link: Link) -> None:
        chain = self._cuts.pop(link, None)
        if chain is not None:
            run_ip("nft", "delete", "table", "inet", chain, ns=link.place)

    def heal_all(self) -> None:
        for link in list(self._cuts):
            try:
                self.heal(link)
            except NetworkError:
                self._cuts.pop(link, None)


def run_tag(pid: int | None = None) -> str:
    return f"{TAG_PREFIX}{pid or os.getpid()}"


def leftover_tags(namespaces: Iterable[str]) -> set[str]:
    """The tags of runs whose harness process is gone, among ``namespaces``' names."""
    tags = set()
    for ns in namespaces:
        m = re.match(rf"({TAG_PREFIX}(\d+))-", ns)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            tags.add(m.group(1))
    return tags


def namespaces() -> list[str]:
    out = run_ip("netns", "list")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep(tags: Iterable[str]) -> list[str]:
    """Delete the namespaces of the runs ``tags`` (whose harness is gone); the names deleted."""
    wanted = tuple(f"{tag}-" for tag in tags)
    gone = []
    for ns in namespaces():
        if ns.startswith(wanted):
            try:
                run_ip("netns", "del", ns)
                gone.append(ns)
            except NetworkError:
                pass
    return gone
