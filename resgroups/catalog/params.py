"""Resource group parameters: the table of names, accepted values and defaults.

A value arrives from the grammar as a :class:`RawValue` (an integer, a
decimal, a quoted string or a bare word such as UNLIMITED) and leaves as the
typed value stored in the catalog:

============================  =======================================  ==========
parameter                     typed value                              unset
============================  =======================================  ==========
cpu_weight                    int 1..10000                             100
cpu_limit                     int hundredths of a percent 1..10000     None
max_active_queries            int >= 1                                 None
max_queued_queries            int >= 0                                 None
queue_timeout                 int milliseconds >= 1                    30000
memory_limit                  int bytes >= 0 (0: no ceiling)           0
scheduling_policy             'fifo' | 'fair'                          'fifo'
max_active_queries_per_user   int >= 1                                 None
parent                        int: the parent group's id               None
============================  =======================================  ==========

``parent`` is written as a name (``parent = etl`` or ``parent = 'etl'``) and
stored as the parent's id, so a rename keeps the tree (SPEC §14): its parse
gives the name as written, which the DDL resolves against the catalog.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final

from resgroups.errors import InvalidParameter, did_you_mean

INT64_MAX: Final = 2**63 - 1
INT32_MAX: Final = 2**31 - 1
_MAX_DIGITS: Final = 30  # more digits than any value in range has, with room to spare


@dataclass(frozen=True)
class RawValue:
    """A parameter value as written: kind is 'number', 'string', 'word',
    'quoted' (a double-quoted identifier) or 'quantity' (a size or duration
    written bare: 512M, 15s)."""

    kind: str
    text: str

    def __str__(self) -> str:
        text = self.text if len(self.text) <= 40 else self.text[:37] + "..."  # messages stay short
        if self.kind == "quoted":
            return f'"{text}"'
        return f"'{text}'" if self.kind == "string" else text


ParamValue = int | str | None


def _integer(raw: RawValue, param: str, allowed: str) -> int:
    if raw.kind == "number":
        try:
            value = Decimal(raw.text)
        except InvalidOperation:
            value = Decimal("NaN")
        # beyond 10^19 nothing is in range: refuse before int() builds a huge number
        small = value.is_finite() and (value.is_zero() or value.adjusted() < 19)
        if small and value == value.to_integral_value():
            return int(value)
    raise InvalidParameter(f"invalid value {raw} for {param}: expected {allowed}")


def _bounded(param: str, low: int, high: int, allowed: str) -> Callable[[RawValue], int]:
    def parse(raw: RawValue) -> int:
        value = _integer(raw, param, allowed)
        if not low <= value <= high:
            raise InvalidParameter(f"invalid value {raw} for {param}: expected {allowed}")
        return value

    return parse


def _is_unlimited(raw: RawValue) -> bool:
    return raw.kind in ("word", "string") and raw.text.lower() == "unlimited"


def _or_unlimited(inner: Callable[[RawValue], int]) -> Callable[[RawValue], int | None]:
    def parse(raw: RawValue) -> int | None:
        return None if _is_unlimited(raw) else inner(raw)

    return parse


_CPU_LIMIT_RE: Final = re.compile(r"^\s*(\d+(?:\.\d{1,2})?|\.\d{1,2})\s*%\s*$")
_CPU_LIMIT_ALLOWED: Final = "'N%' with 0 < N <= 100 and at most 2 decimals, or UNLIMITED"


def parse_cpu_limit(raw: RawValue) -> int | None:
    """'12.5%' -> 1250 (hundredths of a percent); UNLIMITED -> None."""
    if _is_unlimited(raw):
        return None
    match = _CPU_LIMIT_RE.match(raw.text) if raw.kind == "string" else None
    if match is not None:
        centi = int(Decimal(match.group(1)) * 100)
        if 0 < centi <= 10000:
            return centi
    raise InvalidParameter(f"invalid value {raw} for cpu_limit: expected {_CPU_LIMIT_ALLOWED}")


def _with_unit(
    raw: RawValue,
    param: str,
    pattern: re.Pattern[str],
    units: Mapping[str, int],
    default_unit: str,
    allowed: str,
) -> int:
    """A quoted or bare ``<digits><unit>`` value (15s, '2G') in the base unit."""
    match = pattern.match(raw.text) if raw.kind in ("string", "quantity") else None
    if match is None or len(match.group(1)) > _MAX_DIGITS:  # far out of range: no huge int()
        raise InvalidParameter(f"invalid value {raw} for {param}: expected {allowed}")
    return int(match.group(1)) * units[(match.group(2) or default_unit).lower()]


_DURATION_UNITS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}
_DURATION_RE: Final = re.compile(r"^\s*(\d+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_TIMEOUT_ALLOWED: Final = (
    f"integer milliseconds 1..{INT32_MAX}, or a duration such as '250ms', '15s', '2m', '1h'"
)


def parse_duration_ms(raw: RawValue, param: str = "queue_timeout") -> int:
    """500 -> 500; '15s' -> 15000; '2m' -> 120000."""
    if raw.kind == "number":
        millis = _integer(raw, param, _TIMEOUT_ALLOWED)
    else:
        millis = _with_unit(raw, param, _DURATION_RE, _DURATION_UNITS, "ms", _TIMEOUT_ALLOWED)
    if not 1 <= millis <= INT32_MAX:
        raise InvalidParameter(f"invalid value {raw} for {param}: expected {_TIMEOUT_ALLOWED}")
    return millis


_SIZE_UNITS: Final = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE_RE: Final = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_SIZE_ALLOWED: Final = (
    "integer bytes 0..2^63-1, or a size such as '512K', '64M', '2G', '1T' "
    "(powers of 1024, optional B), or UNLIMITED"
)


def parse_size(raw: RawValue, param: str = "memory_limit") -> int:
    """'2G' -> 2147483648; 0 and UNLIMITED -> 0 (no ceiling)."""
    if _is_unlimited(raw):
        return 0
    if raw.kind == "number":
        size = _integer(raw, param, _SIZE_ALLOWED)
    else:
        size = _with_unit(raw, param, _SIZE_RE, _SIZE_UNITS, "", _SIZE_ALLOWED)
    if not 0 <= size <= INT64_MAX:
        raise InvalidParameter(f"invalid value {raw} for {param}: expected {_SIZE_ALLOWED}")
    return size


POLICIES: Final = ("fifo", "fair")


def parse_policy(raw: RawValue) -> str:
    if raw.kind in ("string", "word") and raw.text.lower() in POLICIES:
        return raw.text.lower()
    hint = did_you_mean(raw.text, POLICIES) if raw.kind != "number" else ""
    raise InvalidParameter(
        f"invalid value {raw} for scheduling_policy: expected 'fifo' or 'fair'.{hint}"
    )


def parse_parent(raw: RawValue) -> str:
    """``parent = etl``, ``parent = 'etl'`` or ``parent = "Etl"``: the name as
    written, a quoted identifier kept in its double quotes (the DDL resolves it
    to the group's id against the catalog: :func:`parent_reference`)."""
    if raw.kind == "quoted":
        return '"' + raw.text.replace('"', '""') + '"'
    if raw.kind in ("word", "string") and raw.text and not _is_unlimited(raw):
        return raw.text
    raise InvalidParameter(
        f"invalid value {raw} for parent: expected the name of another resource group"
    )


def parent_reference(value: str) -> tuple[str, bool]:
    """What :func:`parse_parent` gave, as (name, quoted): a quoted identifier
    names a group exactly, a bare word or a string as an unquoted name does."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('""', '"'), True
    return value, False


def _format_parent(value: ParamValue) -> str:
    text = str(value)
    if parent_reference(text)[1]:
        return text
    return "'" + text.replace("'", "''") + "'"


@dataclass(frozen=True)
class Parameter:
    """``parse`` turns what a statement wrote into the typed value; ``valid``
    says whether a typed value (one read back from a catalog log) is one that
    ``parse`` could have produced."""

    name: str
    parse: Callable[[RawValue], ParamValue]
    default: ParamValue
    format: Callable[[ParamValue], str]
    valid: Callable[[ParamValue], bool]


def _int_in(low: int, high: int, *, unlimited: bool = False) -> Callable[[ParamValue], bool]:
    def valid(value: ParamValue) -> bool:
        if value is None:
            return unlimited
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    return valid


def _format_int_or_unlimited(value: ParamValue) -> str:
    return "UNLIMITED" if value is None else str(value)


def _format_cpu_limit(value: ParamValue) -> str:
    if value is None:
        return "UNLIMITED"
    assert isinstance(value, int)
    return f"'{Decimal(value) / 100}%'"


PARAMETERS: Final[Mapping[str, Parameter]] = {
    p.name: p
    for p in (
        Parameter(
            "cpu_weight",
            _bounded("cpu_weight", 1, 10000, "an integer 1..10000"),
            100,
            str,
            _int_in(1, 10000),
        ),
        Parameter(
            "cpu_limit", parse_cpu_limit, None, _format_cpu_limit, _int_in(1, 10000, unlimited=True)
        ),
        Parameter(
            "max_active_queries",
            _or_unlimited(
                _bounded("max_active_queries", 1, INT32_MAX, "an integer >= 1, or UNLIMITED")
            ),
            None,
            _format_int_or_unlimited,
            _int_in(1, INT32_MAX, unlimited=True),
        ),
        Parameter(
            "max_queued_queries",
            _or_unlimited(
                _bounded(
                    "max_queued_queries",
                    0,
                    INT32_MAX,
                    "an integer >= 0 (0: no queueing), or UNLIMITED",
                )
            ),
            None,
            _format_int_or_unlimited,
            _int_in(0, INT32_MAX, unlimited=True),
        ),
        Parameter("queue_timeout", parse_duration_ms, 30_000, str, _int_in(1, INT32_MAX)),
        Parameter("memory_limit", parse_size, 0, str, _int_in(0, INT64_MAX)),
        Parameter(
            "scheduling_policy",
            parse_policy,
            "fifo",
            lambda v: f"'{v}'",
            lambda v: v in POLICIES,
        ),
        Parameter(
            "max_active_queries_per_user",
            _or_unlimited(
                _bounded(
                    "max_active_queries_per_user", 1, INT32_MAX, "an integer >= 1, or UNLIMITED"
                )
            ),
            None,
            _format_int_or_unlimited,
            _int_in(1, INT32_MAX, unlimited=True),
        ),
        Parameter("parent", parse_parent, None, _format_parent, _int_in(0, INT64_MAX)),
    )
}


def lookup(name: str) -> Parameter:
    """The parameter called ``name`` (case-insensitive), or InvalidParameter."""
    try:
        return PARAMETERS[name.lower()]
    except KeyError:
        allowed = ", ".join(PARAMETERS)
        raise InvalidParameter(
            f"unknown resource group parameter {name!r}; allowed: {allowed}."
            + did_you_mean(name, PARAMETERS)
        ) from None


def parse_param(name: str, raw: RawValue) -> tuple[str, ParamValue]:
    param = lookup(name)
    return param.name, param.parse(raw)
