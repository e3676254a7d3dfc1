"""What a load client asks for: which key (uniform or zipf), under which freshness bound, in which session.

Shared by the locust users and the scenario runner so that both generate the same
workload from the same spec strings:

- key choice: ``uniform`` over ``{prefix}0 .. {prefix}{n-1}`` or ``zipf`` with exponent ``s``,
  where rank 1 (the hottest key) is ``{prefix}0``, rank 2 ``{prefix}1`` and so on;
- bound mix: ``"none:4,max_lag=100:2,max_staleness_ms=5000:2,session:2"`` — weighted kinds of
  bound (``max_input_lag_ms=N`` bounds the table's pipeline lag); ``session`` passes the session's position (the merge of every position this session
  has seen) as ``min_position``, which asks for monotonic reads.
"""

from __future__ import annotations

import bisect
import itertools
import random
from dataclasses import dataclass, field
from typing import Any

from freshroute.position import Position

DEFAULT_BOUND_MIX = "none:4,max_lag=100:2,max_staleness_ms=5000:2,session:2"
BOUND_KINDS = ("none", "max_lag", "max_staleness_ms", "max_input_lag_ms", "session")
_VALUED = ("max_lag", "max_staleness_ms", "max_input_lag_ms")


class KeyChooser:
    """Uniform or zipf-skewed choice over a fixed keyspace."""

    def __init__(self, keys: list[str], distribution: str = "uniform", zipf_s: float = 1.1,
                 rng: random.Random | None = None) -> None:
        if not keys:
            raise ValueError("the keyspace is empty")
        if distribution not in ("uniform", "zipf"):
            raise ValueError(f"key distribution must be 'uniform' or 'zipf', not {distribution!r}")
        if distribution == "zipf" and zipf_s <= 0:
            raise ValueError("zipf exponent must be > 0")
        self.keys = keys
        self.distribution = distribution
        self._rng = rng or random.Random()
        # Cumulative weights once, so each choice is one random number and one bisect.
        weights = [1.0 / (rank ** zipf_s) for rank in range(1, len(keys) + 1)] if distribution == "zipf" else None
        self._cumulative = list(itertools.accumulate(weights)) if weights else None

    @classmethod
    def for_keyspace(cls, prefix: str = "sensor-", count: int = 100, distribution: str = "uniform",
                     zipf_s: float = 1.1, seed: int | None = None, rng: random.Random | None = None) -> "KeyChooser":
        return cls([f"{prefix}{i}" for i in range(count)], distribution, zipf_s, rng or random.Random(seed))

    def probability(self, index: int) -> float:
        """Probability of choosing ``keys[index]``."""
        if self._cumulative is None:
            return 1.0 / len(self.keys)
        lo = self._cumulative[index - 1] if index else 0.0
        return (self._cumulative[index] - lo) / self._cumulative[-1]

    def choose(self) -> str:
        if self._cumulative is None:
            return self.keys[self._rng.randrange(len(self.keys))]
        x = self._rng.random() * self._cumulative[-1]
        return self.keys[min(bisect.bisect_right(self._cumulative, x), len(self.keys) - 1)]


@dataclass(frozen=True)
class BoundChoice:
    """One kind of bound in a mix; ``value`` is the limit for max_lag / max_staleness_ms / max_input_lag_ms."""

    kind: str
    value: int | None = None
    weight: float = 1.0

    def label(self) -> str:
        return self.kind if self.value is None else f"{self.kind}={self.value}"


def parse_bound_mix(spec: str) -> list[BoundChoice]:
    """Parse ``"none:4,max_lag=100:2,max_staleness_ms=5000:2,session:2"`` (weights optional, default 1)."""
    out: list[BoundChoice] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        body, _, weight_s = part.partition(":")
        kind, _, value_s = body.partition("=")
        kind = kind.strip()
        if kind not in BOUND_KINDS:
            raise ValueError(f"unknown bound kind {kind!r} in {spec!r}; use one of {', '.join(BOUND_KINDS)}")
        if kind in _VALUED:
            if not value_s:
                raise ValueError(f"{kind} needs a value, e.g. {kind}=100")
            value: int | None = int(value_s)
            if value < 0:
                raise ValueError(f"{kind} must be >= 0")
        elif value_s:
            raise ValueError(f"{kind} takes no value")
        else:
            value = None
        weight = float(weight_s) if weight_s else 1.0
        if weight <= 0:
            raise ValueError(f"weight of {body!r} must be > 0")
        out.append(BoundChoice(kind, value, weight))
    if not out:
        raise ValueError("the bound mix is empty")
    return out


class BoundMixer:
    """Draws a bound kind per request with the mix's weights."""

    def __init__(self, mix: list[BoundChoice], rng: random.Random | None = None) -> None:
        self.mix = mix
        self._cumulative = list(itertools.accumulate(c.weight for c in mix))
        self._rng = rng or random.Random()

    def choose(self) -> BoundChoice:
        x = self._rng.random() * self._cumulative[-1]
        return self.mix[min(bisect.bisect_right(self._cumulative, x), len(self.mix) - 1)]


@dataclass
class Session:
    """A client session: remembers the latest position per table for monotonic reads."""

    name: str
    positions: dict[str, Position] = field(default_factory=dict)
    seq: int = 0

    def observe(self, table: str, token: str | None) -> None:
        """Fold a response's position into the session (tokens that do not parse are ignored)."""
        if not token:
            return
        try:
            pos = Position.decode(token)
        except Exception:  # noqa: BLE001 - a server bug shows up in the consistency check, not here
            return
        if pos.table != table:
            return
        prev = self.positions.get(table)
        self.positions[table] = prev.merge(pos) if prev else pos

    def token(self, table: str) -> str | None:
        pos = self.positions.get(table)
        return pos.encode() if pos else None

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def bound_params(choice: BoundChoice, session: Session | None, table: str) -> dict[str, Any]:
    """The request's bound as query parameters / ``Bound`` fields; empty for ``none``."""
    if choice.kind in _VALUED:
        return {choice.kind: choice.value}
    if choice.kind == "session" and session is not None:
        token = session.token(table)
        return {"min_position": token} if token else {}
    return {}
