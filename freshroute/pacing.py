"""Back-pressure for a connection that answers what it reads (the store node's read port, the
router's gRPC front): while the peer does not read its answers, it is not read either, so
answers cannot pile up in memory."""

from __future__ import annotations

import asyncio


class PacedByAnswers(asyncio.Protocol):
    """An asyncio protocol that stops reading while its transport's write buffer is full.

    Subclasses keep their transport in ``_transport`` (None once the connection is lost).
    """

    _transport: asyncio.Transport | None = None

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
