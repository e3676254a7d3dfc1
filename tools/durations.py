"""A duration flag of the ``freshroute`` command: ``1s``, ``5m``, ``1h``, ``7d`` or milliseconds."""

from __future__ import annotations

import argparse
from typing import Callable

from freshroute.windows import duration_ms


def duration_arg(flag: str, positive: bool = False) -> Callable[[str], int]:
    """``flag``'s parser (argparse's ``type``): its milliseconds; ``positive``: 0 is refused too."""
    def parse(text: str) -> int:
        try:
            ms = duration_ms(int(text) if text.isdigit() else text, flag)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if ms < 0 or (positive and ms == 0):
            raise argparse.ArgumentTypeError(f"{flag} must be a {'positive ' if positive else ''}duration, not "
                                             f"{text!r}")
        return ms

    return parse
