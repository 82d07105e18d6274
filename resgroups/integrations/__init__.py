"""Adapters that run another engine's statements as managed queries (``duckdb``)."""
