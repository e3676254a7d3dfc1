"""The bound in the public gRPC API: a ``Bound`` message's fields are the bound's parameters under their own names,
read as any front reads a bound and written as every wire shows one — so a parameter new to the definition and the
proto needs nothing here."""

from __future__ import annotations

from freshroute.bound import Bound
from proto import router_pb2


def bound_of_message(msg: router_pb2.Bound) -> Bound:
    """A caller's ``Bound`` message (its set fields; ``as_of`` is the read's, not the bound's); anything malformed is
    an InvalidArgument naming the field."""
    return Bound.parse({field.name: value for field, value in msg.ListFields()})


def bound_message(bound: Bound) -> router_pb2.Bound:
    """``bound`` as a ``Bound`` message."""
    return router_pb2.Bound(**bound.shown())
