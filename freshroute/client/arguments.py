"""What a caller hands the clients, checked once for both: a batch's keys, and a scan's range and sizes."""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple

from freshroute.errors import InvalidArgument


def batch_keys(keys: Iterable[str]) -> list[str]:
    """A batch's keys as a list; one string (which would read as its characters) or no iterable is refused."""
    if isinstance(keys, (str, bytes)):
        raise InvalidArgument("keys must be a list of strings, not one string", field="keys")
    try:
        return list(keys)
    except TypeError:
        raise InvalidArgument(f"keys must be a list of strings, not {type(keys).__name__}", field="keys") from None


def _count(field: str, value: Any) -> int:
    if type(value) is not int or value < 0:
        raise InvalidArgument(f"{field} must be a non-negative integer, got {value!r}", field=field)
    return value


class ScanRange(NamedTuple):
    """A scan's key range (``""``: unbounded), how many rows at most (None: all) and how many per page."""

    prefix: str
    start: str
    end: str
    limit: int | None
    page_size: int

    @classmethod
    def of(cls, prefix: str | None, start: str | None, end: str | None, limit: int | None, page_size: int | None,
           max_page: int) -> "ScanRange":
        """From a caller's arguments; ``page_size`` None or 0 is the largest page the routing policy allows."""
        size = _count("page_size", page_size) if page_size is not None else 0
        if size > max_page:
            raise InvalidArgument(f"page_size must be at most {max_page}", field="page_size")
        return cls(prefix or "", start or "", end or "", None if limit is None else _count("limit", limit),
                   size or max_page)

    def next_page(self, sent: int) -> int | None:
        """The size of the page to ask for after ``sent`` rows; None when the limit is reached."""
        if self.limit is None:
            return self.page_size
        return min(self.page_size, self.limit - sent) if sent < self.limit else None
