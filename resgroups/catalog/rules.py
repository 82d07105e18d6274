"""Runaway-query rules (SPEC §16): what a condition measures, the actions, and
how a threshold is written and shown.

A rule is ``ON RESOURCE GROUP g WHEN metric > threshold [AND ...] THEN action``.
Every threshold is stored as an integer in the metric's base unit:

===========  =====================================  ================================
metric       what it measures                       threshold written as
===========  =====================================  ================================
cpu_time     CPU charged to the query, its tasks    milliseconds, or '250ms', 30s, 2m
elapsed      wall time since its first admission    the same
memory       its tracked memory's high-water mark   bytes, or '512K', 64M, 2G, 1T
rows         rows it reported with q.scanned()      an integer
bytes        bytes it reported with q.scanned()     bytes, or a size
===========  =====================================  ================================

The vocabulary lives in the catalog (as the group parameters do) so that the
statements that write a rule and the records that apply it check the same
ranges.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from resgroups.catalog.params import (
    INT64_MAX,
    RawValue,
    parse_duration_ms,
    parse_size,
)
from resgroups.errors import InvalidParameter, did_you_mean

KILL: Final = "kill"
MOVE: Final = "move"
LOG: Final = "log"
ACTIONS: Final = (KILL, MOVE, LOG)


@dataclass(frozen=True)
class Metric:
    """``parse`` turns a written threshold into the stored integer; ``format``
    writes it back the way a user would type it."""

    name: str
    unit: str  # "ms", "bytes" or "rows"
    parse: Callable[[RawValue], int]
    format: Callable[[int], str]


_ZERO: Final = re.compile(r"^\s*0+\s*(ms|s|m|h)?\s*$", re.IGNORECASE)


def _duration(metric: str) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        if raw.kind in ("number", "string", "quantity") and _ZERO.match(raw.text):
            return 0  # '0ms', 0s: what format_duration writes for 0 reads back
        return parse_duration_ms(raw, metric)

    return parse


def _size(metric: str) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        try:
            if raw.kind in ("word", "string") and raw.text.lower() == "unlimited":
                raise InvalidParameter("unlimited")
            return parse_size(raw, metric)
        except InvalidParameter:
            raise InvalidParameter(
                f"invalid threshold {raw} for {metric}: expected integer bytes or a size "
                "such as '512K', '64M', '2G' (powers of 1024, optional B)"
            ) from None

    return parse


def _count(metric: str) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        text = raw.text.strip()
        if raw.kind == "number" and text.isdigit() and len(text) <= 19 and int(text) <= INT64_MAX:
            return int(text)
        raise InvalidParameter(
            f"invalid threshold {raw} for {metric}: expected an integer 0..2^63-1"
        )

    return parse


def format_duration(ms: int) -> str:
    """30000 -> '30s'; 1500 -> '1500ms': the largest unit that is exact."""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"'{ms // size}{unit}'"
    return f"'{ms}ms'"


def format_size(nbytes: int) -> str:
    """2147483648 -> '2G'; 1000 -> '1000': the largest power of 1024 that is exact."""
    for unit, size in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes and nbytes % size == 0:
            return f"'{nbytes // size}{unit}'"
    return str(nbytes)


METRICS: Final[Mapping[str, Metric]] = {
    m.name: m
    for m in (
        Metric("cpu_time", "ms", _duration("cpu_time"), format_duration),
        Metric("elapsed", "ms", _duration("elapsed"), format_duration),
        Metric("memory", "bytes", _size("memory"), format_size),
        Metric("rows", "rows", _count("rows"), str),
        Metric("bytes", "bytes", _size("bytes"), format_size),
    )
}


def metric(name: str) -> Metric:
    """The metric called ``name`` (case-insensitive), or InvalidParameter."""
    found = METRICS.get(name.lower())
    if found is None:
        raise InvalidParameter(
            f"unknown rule condition {name!r}; a condition is one of "
            f"{', '.join(METRICS)} followed by > and a threshold." + did_you_mean(name, METRICS)
        )
    return found


def parse_watch(raw: RawValue) -> int:
    """The ``watch`` option: a duration in milliseconds (0: no watch)."""
    return _duration("watch")(raw)


def format_conditions(conditions: tuple[tuple[str, int], ...]) -> str:
    """The conditions as normalized text: ``cpu_time > '30s' AND memory > '2G'``."""
    return " AND ".join(f"{name} > {METRICS[name].format(value)}" for name, value in conditions)


def conditions_problem(conditions: object) -> str | None:
    """Why a record's conditions are not ones SQL could have written, or None."""
    if not isinstance(conditions, (list, tuple)) or not conditions:
        return f"conditions = {conditions!r}: expected a non-empty list of [metric, threshold]"
    seen: set[str] = set()
    for item in conditions:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            return f"condition {item!r}: expected [metric, threshold]"
        name, value = item
        if name not in METRICS:
            return f"condition on unknown metric {name!r}"
        if name in seen:
            return f"two conditions on {name}"
        seen.add(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= INT64_MAX:
            return f"threshold {value!r} of {name}: expected an integer 0..2^63-1"
    return None
