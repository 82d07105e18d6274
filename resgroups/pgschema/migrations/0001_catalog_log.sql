-- The catalog log (SPEC §10): one row per change record, keyed by version.
-- Versions are assigned by the appending engine under a transaction-scoped
-- advisory lock, after it has read every record before it: no gap, no
-- duplicate (the primary key refuses a duplicate whatever happens).
CREATE TABLE IF NOT EXISTS resgroups_catalog_log (
    version    bigint      PRIMARY KEY CHECK (version > 0),
    record     jsonb       NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
