"""The highest input rate the pipeline holds (``pipeline_max_events_per_s``).

The demo producer, a process of its own, drives the input at each rate of a ladder for ``hold_s`` seconds. The
pipeline holds a rate when every table's input lag, as ``/v1/tables`` tells any caller, stays within two seconds of
input through the step's last ``judged_s`` seconds: it may fall behind while the rate starts, but not keep falling.
The ladder stops at the first rate not held; before each step the lag comes back to its level without the load.
The figure is the rate the producer really sent in the highest step held (a Python producer on a small machine may
send less than asked). ``loadtest.peers`` judges a peer the same way by its consumer group's lag (:class:`Lag`).

    python -m loadtest.pipeline_rate [--router http://127.0.0.1:8080] [--rates 1000 2000 ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from contextlib import closing
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

import orjson

from loadtest.freshness import InputLag, start_input_load, stop_input_load

RATES = (1000, 2000, 3500, 5000, 7000, 10000, 14000)
BEHIND_S = 2.0  # a rate is held while every table's median lag is within this many seconds of input
PAUSE_S = 10.0  # ... and its worst (a query's checkpoint pauses it) within this many


class Lag(Protocol):
    """Where a system is in its input: records behind the input's end by table (None: unknown). freshroute's is
    :class:`loadtest.freshness.InputLag`; a peer's is its consumer group's (:class:`loadtest.consumer_lag.GroupLag`)."""

    def sample_all(self) -> dict[str, int | None]: ...


@dataclass(frozen=True)
class Step:
    rate: float  # asked for
    sent_per_s: float  # what the producer sent
    lag_p50: dict[str, int]  # each table's median input lag (records) in the judged part of the step
    lag_max: dict[str, int]  # and its highest
    held: bool


def settle(lag: Lag, timeout_s: float, floor: int = 100) -> bool:
    """Wait until every table's input lag is at most ``floor`` records; whether it got there in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lags = lag.sample_all()
        if lags and all(n is not None and n <= floor for n in lags.values()):
            return True
        time.sleep(0.5)
    return False


def hold(lag: Lag, bootstrap: str, topic: str, rate: float, hold_s: float, judged_s: float) -> Step:
    """One step: the input at ``rate`` for ``hold_s``, each table's lag sampled every second."""
    load = start_input_load(bootstrap, topic, rate, sensors=1000, max_s=hold_s + 30)
    started = time.monotonic()
    samples: dict[str, list[int]] = {}
    try:
        while time.monotonic() - started < hold_s:
            time.sleep(1.0)
            if time.monotonic() - started < hold_s - judged_s:
                continue
            for table, n in lag.sample_all().items():
                # Unknown counts as not held: the pipeline stopped saying where it is.
                samples.setdefault(table, []).append(n if n is not None else sys.maxsize)
    finally:
        sent = stop_input_load(load)
        elapsed = time.monotonic() - started
    sent_per_s = sent / elapsed
    p50 = {t: int(statistics.median(v)) for t, v in samples.items()}
    worst = {t: max(v) for t, v in samples.items()}
    return Step(rate, round(sent_per_s, 1), p50, worst, held(p50, worst, sent_per_s))


def held(p50: dict[str, int], worst: dict[str, int], sent_per_s: float) -> bool:
    """Whether every table kept within :data:`BEHIND_S` of input at its median and :data:`PAUSE_S` at its worst at
    that rate (no table seen: not held)."""
    return (bool(p50) and sent_per_s > 0 and all(n <= BEHIND_S * sent_per_s for n in p50.values())
            and all(n <= PAUSE_S * sent_per_s for n in worst.values()))


def measure(bootstrap: str, lag: Lag, topic: str, rates: tuple[float, ...] = RATES, hold_s: float = 60.0,
            judged_s: float = 30.0, settle_s: float = 180.0, say: Callable[[str], None] = lambda _m: None) -> dict:
    """Steps up the ladder until a rate is not held; ``pipeline_max_events_per_s`` and every step."""
    steps: list[Step] = []
    for rate in rates:
        if not settle(lag, settle_s):
            say(f"  the pipeline did not get back to its input's end within {settle_s:.0f} s; stopping")
            break
        step = hold(lag, bootstrap, topic, rate, hold_s, judged_s)
        steps.append(step)
        lags = ", ".join(f"{t} {step.lag_p50[t]:,}/{n:,}" for t, n in sorted(step.lag_max.items()))
        say(f"  {step.sent_per_s:,.0f} readings/s for {hold_s:.0f} s: input lag p50/max {lags} records in its "
            f"last {judged_s:.0f} s — {'held' if step.held else 'NOT held'}")
        if not step.held:
            break
    settle(lag, settle_s)
    held = [s.sent_per_s for s in steps if s.held]
    return {"pipeline_max_events_per_s": max(held) if held else 0.0, "steps": [asdict(s) for s in steps]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.pipeline_rate", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap", default="127.0.0.1:19092")
    p.add_argument("--router", default="http://127.0.0.1:8080")
    p.add_argument("--topic", default="readings")
    p.add_argument("--rates", type=float, nargs="+", default=list(RATES))
    p.add_argument("--hold-s", type=float, default=60.0)
    a = p.parse_args(argv)
    with closing(InputLag(a.router)) as lag:
        out = measure(a.bootstrap, lag, a.topic, tuple(a.rates), a.hold_s, say=print)
    print(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
