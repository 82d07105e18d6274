"""Adapters that run another engine's statements as managed queries (SPEC §17):
``duckdb``, ``datafusion``, ``polars`` and ``sqlite``, each importing its engine
(an optional extra); ``native_cpu`` charges an engine's own threads' CPU."""
