"""resgroups: resource groups for Python query engines.

Named policies (admission limits, CPU weights and limits, fifo or fair
scheduling, memory budgets) mapped to principals, created with SQL DDL and
observed through ``resource_groups()``.

>>> import resgroups
>>> with resgroups.Engine() as engine:
...     session = engine.connect(user="analyst")
...     _ = session.execute("CREATE RESOURCE GROUP reporting WITH (cpu_weight = 50)")
...     [row["name"] for row in engine.resource_groups()]
['default', 'reporting']
"""

from __future__ import annotations

from resgroups.catalog.selectors import Estimate
from resgroups.engine import Engine
from resgroups.errors import (
    AdmissionRejected,
    AmbiguousColumn,
    AuthenticationFailed,
    CardinalityViolation,
    CatalogError,
    CatalogLagError,
    CatalogLocked,
    CatalogWriteError,
    CoordinationUnavailable,
    DatatypeMismatch,
    DivisionByZero,
    EngineClosed,
    Error,
    FeatureNotSupported,
    GroupingError,
    InternalError,
    InvalidParameter,
    InvalidRegularExpression,
    InvalidTextRepresentation,
    MemoryLimitExceeded,
    NumericOverflow,
    PermissionDenied,
    ProgramLimitExceeded,
    QueryCancelled,
    QueryTimeout,
    QueueTimeout,
    ReadOnlyReplica,
    RunawayQuery,
    SqlSyntaxError,
    UndefinedColumn,
    UndefinedFunction,
    UndefinedTable,
    UndefinedType,
)
from resgroups.result import Result
from resgroups.session import Session
from resgroups.version import __version__

__all__ = [
    "AdmissionRejected",
    "AmbiguousColumn",
    "AuthenticationFailed",
    "CardinalityViolation",
    "CatalogError",
    "CatalogLagError",
    "CatalogLocked",
    "CatalogWriteError",
    "CoordinationUnavailable",
    "DatatypeMismatch",
    "DivisionByZero",
    "Engine",
    "EngineClosed",
    "Error",
    "Estimate",
    "FeatureNotSupported",
    "GroupingError",
    "InternalError",
    "InvalidParameter",
    "InvalidRegularExpression",
    "InvalidTextRepresentation",
    "MemoryLimitExceeded",
    "NumericOverflow",
    "PermissionDenied",
    "ProgramLimitExceeded",
    "QueryCancelled",
    "QueryTimeout",
    "QueueTimeout",
    "ReadOnlyReplica",
    "Result",
    "RunawayQuery",
    "Session",
    "SqlSyntaxError",
    "UndefinedColumn",
    "UndefinedFunction",
    "UndefinedTable",
    "UndefinedType",
    "__version__",
]
