"""The partitions a scenario makes, by the stack's component names, and what applies and heals them.

A scenario is one fault, held for a while and healed, under the recorded lookup load of :mod:`loadtest.scenario`:
a cut between two components, both ways or one way (``out``: the first one's packets to the second are lost; ``in``:
the second one's packets to the first are lost), or a component's links made slow and lossy (``slow``:
:mod:`loadtest.partitions.slow_links`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from loadtest.partitions.network import Link, Network
from loadtest.partitions.slow_links import SlowLinks
from loadtest.scenario import Fault
from tools.local.stack import Stack


SLOW_DELAY_MS = 200
SLOW_LOSS_PERCENT = 30


@dataclass(frozen=True)
class Scenario:
    name: str
    component: str  # the component cut off
    peer: str  # from this one ("" for slow links: all of them)
    way: str  # both | out | in | slow
    story: str

    def faults(self, at_s: float, hold_s: float) -> list[Fault]:
        if self.way == "slow":
            return [Fault(at_s, "slow", self.component, hold_s)]
        return [Fault(at_s, f"cut-{self.way}", f"{self.component}>{self.peer}", hold_s)]


SCENARIOS = {s.name: s for s in (
    Scenario("node-broker", "store-node-2", "broker", "both",
             "a store node cut off from the broker, not from Redis or the routers"),
    Scenario("node-broker-out", "store-node-2", "broker", "out",
             "a store node whose requests to the broker are lost (the broker's packets still arrive)"),
    Scenario("node-broker-in", "store-node-2", "broker", "in",
             "a store node that no longer hears the broker (its requests still arrive)"),
    Scenario("node-redis", "store-node-2", "redis", "both",
             "a store node cut off from Redis, not from the routers or the broker"),
    Scenario("router-redis", "router", "redis", "both", "the router cut off from Redis"),
    Scenario("router-node", "router", "store-node-2", "both", "the router cut off from one store node"),
    Scenario("pipeline-broker", "pipeline", "broker", "both", "the pipeline cut off from the broker"),
    Scenario("pipeline-redis", "pipeline", "redis", "both", "the pipeline cut off from Redis"),
    Scenario("slow-node", "store-node-2", "", "slow",
             f"{SLOW_LOSS_PERCENT} % loss and {SLOW_DELAY_MS} ms delay on one store node's links"),
)}


class NetworkFaults:
    """Applies a scenario's cuts to ``network`` (the injector :func:`loadtest.scenario.run` drives) and heals them."""

    def __init__(self, stack: Stack, t0: float, say: Callable[[str], None], network: Network,
                 slow_links: dict[str, SlowLinks] | None = None) -> None:
        self.stack = stack
        self.t0 = t0
        self.say = say
        self.network = network
        self.slow_links = slow_links or {}
        self.events: list[dict[str, Any]] = []

    def _event(self, text: str) -> None:
        t = round(time.monotonic() - self.t0, 3)
        self.events.append({"t": t, "event": text})
        self.say(f"[{t:6.1f}s] FAULT {text}")

    def link(self, fault: Fault) -> Link:
        if not fault.action.startswith("cut-"):
            raise ValueError(f"unknown network fault {fault.action!r}")
        component, peer = fault.target.split(">")
        place = self.stack.config.place_of
        return Link(place(component), place(peer), fault.action.removeprefix("cut-"))

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
        link = self.link(fault)
        component, peer = fault.target.split(">")
        arrow = {"both": "<-/->", "out": "-/->", "in": "<-/-"}[link.way]
        self.network.cut(link)
        self._event(f"cut {component} {arrow} {peer} for {fault.hold_s:g}s")
        time.sleep(fault.hold_s)
        self.network.heal(link)
        self._event(f"heal {component} {arrow} {peer}")

    def undo_all(self) -> None:
        self.network.heal_all()
        for links in self.slow_links.values():
            links.heal()
