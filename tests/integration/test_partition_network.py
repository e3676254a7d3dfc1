"""The partition harness's network on real namespaces: a bridge joins them, a cut drops a link's packets (both ways,
or one), healing lets them through again, and removing the network leaves no namespace behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from loadtest.partitions.network import Link, Network, namespaces, run_tag, why_not_here

pytestmark = [pytest.mark.integration, pytest.mark.light]

PORT = 7000
SERVER = f"""
import socket
s = socket.create_server(("0.0.0.0", {PORT}))
s.settimeout(60)
while True:
    c, _ = s.accept()
    c.sendall(b"hello")
    c.close()
"""


def connects(ns: str, address: str) -> bool:
    """Whether a process in ``ns`` gets the server's greeting within a second."""
    probe = (f"import socket\ntry:\n    s = socket.create_connection(('{address}', {PORT}), timeout=1)\n"
             f"    print(s.recv(5).decode())\nexcept OSError:\n    print('silence')")
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=20)
    return out.stdout.strip() == "hello"


@pytest.fixture
def network():
    why = why_not_here()
    if why:
        pytest.skip(f"no network namespaces here: {why}")
    tag = run_tag()  # swept by a later run should this one be killed
    net = Network(tag, {f"{tag}-a": "10.77.0.11", f"{tag}-b": "10.77.0.12"}, "10.77.0.100")
    server = None
    try:
        net.create()
        server = subprocess.Popen(["ip", "netns", "exec", f"{tag}-b", sys.executable, "-c", SERVER])
        deadline = time.monotonic() + 10
        while not connects(f"{tag}-a", "10.77.0.12") and time.monotonic() < deadline:
            time.sleep(0.1)
        yield net
    finally:
        if server is not None:
            server.kill()
            server.wait()
        net.remove()
    assert not [ns for ns in namespaces() if ns.startswith(f"{tag}-")]


def test_a_cut_drops_a_link_until_healed_both_ways_or_one(network):
    a, b = (f"{network.tag}-a", f"{network.tag}-b")
    assert connects(a, "10.77.0.12") and connects(network.harness, "10.77.0.12")
    for way in ("both", "out", "in"):
        link = Link(a, b, way)
        network.cut(link)
        assert not connects(a, "10.77.0.12"), way  # a's SYN (out) or b's answer (in) is lost
        assert connects(network.harness, "10.77.0.12"), way  # only that link
        network.heal(link)
        assert connects(a, "10.77.0.12"), way
