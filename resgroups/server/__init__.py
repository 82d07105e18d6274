"""The servers of ``resgroups serve`` (SPEC §13): the PostgreSQL wire protocol
and HTTP, on one event loop, over one engine."""
