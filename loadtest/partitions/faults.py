"""The partitions a scenario makes, by the stack's component names, and what applies and heals them.

A scenario is one fault, held for a while and healed, under the recorded lookup load of :mod:`loadtest.scenario`:
a cut between two components, both ways or one way (``out``: the first one's packets to the second are lost; ``in``:
the second one's packets to the first are lost), or a component's links made slow and lossy (``slow``:
:mod:`loadtest.partitions.slow_links`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from loadtest.partitions.network import Link, Network
from loadtest.partitions.slow_links import SlowLinks
from loadtest.partitions.watch import (Sign, input_behind, metadata_lost, metrics_metadata_lost, metrics_node_dead,
                                       metrics_replicas_behind, node_dead, replicas_behind)
from loadtest.scenario import Fault, FaultInjector
from tools.local.stack import Stack


TABLE = "sensor_stats"  # the table the load reads
SLOW_DELAY_MS = 200
SLOW_LOSS_PERCENT = 30


@dataclass(frozen=True)
class Scenario:
    name: str
    component: str  # the component cut off
    peer: str  # from these (comma-separated; "" for slow links: all of them)
    way: str  # both | out | in | slow
    story: str
    watch: str = ""  # what shows it in the router's view: behind | dead | metadata | input ("": nothing there)

    @property
    def sentinel(self) -> bool:
        """Whether the scenario needs Redis behind Sentinel."""
        return "redis-sentinel" in self.peer

    def sign(self, slack_ms: int) -> Sign | None:
        """The scenario's sign of trouble in the router's cluster view, if it has one."""
        node = self.component.removeprefix("store-")  # store-node-2's node id is node-2
        return {"behind": replicas_behind(node, slack_ms), "dead": node_dead(node), "metadata": metadata_lost,
                "input": input_behind(TABLE, slack_ms)}.get(self.watch)

    def metrics_sign(self, slack_ms: int) -> Sign | None:
        """The same in the router's Prometheus metrics, where they have it (no input lag there)."""
        node = self.component.removeprefix("store-")
        return {"behind": metrics_replicas_behind(node, slack_ms), "dead": metrics_node_dead(node),
                "metadata": metrics_metadata_lost}.get(self.watch)

    def faults(self, at_s: float, hold_s: float) -> list[Fault]:
        if self.way == "slow":
            return [Fault(at_s, "slow", self.component, hold_s)]
        return [Fault(at_s, f"cut-{self.way}", f"{self.component}>{self.peer}", hold_s)]


SCENARIOS = {s.name: s for s in (
    Scenario("node-broker", "store-node-2", "broker", "both",
             "a store node cut off from the broker, not from Redis or the routers", watch="behind"),
    Scenario("node-broker-out", "store-node-2", "broker", "out",
             "a store node whose requests to the broker are lost (the broker's packets still arrive)", watch="behind"),
    Scenario("node-broker-in", "store-node-2", "broker", "in",
             "a store node that no longer hears the broker (its requests still arrive)", watch="behind"),
    Scenario("node-redis", "store-node-2", "redis", "both",
             "a store node cut off from Redis, not from the routers or the broker", watch="dead"),
    Scenario("router-redis", "router", "redis", "both", "the router cut off from Redis", watch="metadata"),
    Scenario("router-node", "router", "store-node-2", "both", "the router cut off from one store node"),
    Scenario("pipeline-broker", "pipeline", "broker", "both", "the pipeline cut off from the broker", watch="input"),
    Scenario("pipeline-redis", "pipeline", "redis", "both", "the pipeline cut off from Redis", watch="input"),
    Scenario("redis-sentinel", "redis", "redis-sentinel-1,redis-sentinel-2,redis-replica", "both",
             "the Redis primary cut off from Sentinel's majority and its replica, not from the store nodes or the "
             "router (a stack with --redis-sentinel)", watch="metadata"),
    Scenario("slow-node", "store-node-2", "", "slow",
             f"{SLOW_LOSS_PERCENT} % loss and {SLOW_DELAY_MS} ms delay on one store node's links", watch="behind"),
)}


class NetworkFaults(FaultInjector):
    """Applies a scenario's cuts to ``network`` (the injector :func:`loadtest.scenario.run` drives) and heals them,
    recording its events as the process faults' injector does."""

    def __init__(self, stack: Stack, t0: float, say: Callable[[str], None], network: Network,
                 slow_links: dict[str, SlowLinks] | None = None) -> None:
        super().__init__(stack, t0, say)
        self.network = network
        self.slow_links = slow_links or {}

    def links(self, fault: Fault) -> list[Link]:
        """The links a cut breaks: the component's to each of its peers (``a>b,c``)."""
        if not fault.action.startswith("cut-"):
            raise ValueError(f"unknown network fault {fault.action!r}")
        component, peers = fault.target.split(">")
        place = self.stack.config.place_of
        return [Link(place(component), place(peer), fault.action.removeprefix("cut-")) for peer in peers.split(",")]

    def apply(self, fault: Fault) -> None:
        """Cut (or slow), hold, heal (blocking: :func:`loadtest.scenario.run` calls it in a thread)."""
        if fault.action == "slow":
            links = self.slow_links[fault.target]
            links.slow(SLOW_DELAY_MS, SLOW_LOSS_PERCENT)
            self._event(f"slow {fault.target}'s links: {SLOW_LOSS_PERCENT} % loss, {SLOW_DELAY_MS} ms delay "
                        f"for {fault.hold_s:g}s")
            time.sleep(fault.hold_s)
            links.heal()
            self._event(f"heal {fault.target}'s links")
            return
        links = self.links(fault)
        component, peers = fault.target.split(">")
        arrow = {"both": "<-/->", "out": "-/->", "in": "<-/-"}[links[0].way]
        for link in links:
            self.network.cut(link)
        self._event(f"cut {component} {arrow} {peers} for {fault.hold_s:g}s")
        time.sleep(fault.hold_s)
        for link in links:
            self.network.heal(link)
        self._event(f"heal {component} {arrow} {peers}")

    def undo_all(self) -> None:
        self.network.heal_all()
        for links in self.slow_links.values():
            links.heal()
