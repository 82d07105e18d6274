-- Fleet admission (SPEC §11): a lease per running query of a group with a
-- max_active_queries, and a per-group counter of leases kept exact by
-- statement-level triggers, so every writer keeps it right (the acquire
-- function, batched releases, the expiry sweep, shutdown cleanup, a manual
-- DELETE). The advisory lock key of a group is (0x7267 + 16, hashtext(name)).
CREATE TABLE IF NOT EXISTS resgroups_fleet_leases (
    query_id    text        PRIMARY KEY,
    group_name  text        NOT NULL,
    instance_id text        NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    renewed_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS resgroups_fleet_leases_by_instance
    ON resgroups_fleet_leases (instance_id);
CREATE INDEX IF NOT EXISTS resgroups_fleet_leases_by_renewal
    ON resgroups_fleet_leases (renewed_at);

CREATE TABLE IF NOT EXISTS resgroups_fleet_counters (
    group_name text   PRIMARY KEY,
    leased     bigint NOT NULL DEFAULT 0
);

-- inserts: one upsert per group, in group-name order
CREATE OR REPLACE FUNCTION resgroups_fleet_count_inserts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO resgroups_fleet_counters AS c (group_name, leased)
    SELECT group_name, count(*) FROM new_rows GROUP BY group_name ORDER BY group_name
    ON CONFLICT (group_name) DO UPDATE SET leased = c.leased + EXCLUDED.leased;
    RETURN NULL;
END
$$;

-- deletes: the counter rows of every group touched are locked in group-name
-- order first, so two multi-group deletes can never deadlock
CREATE OR REPLACE FUNCTION resgroups_fleet_count_deletes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM resgroups_fleet_counters
     WHERE group_name IN (SELECT DISTINCT group_name FROM old_rows)
     ORDER BY group_name
       FOR UPDATE;
    UPDATE resgroups_fleet_counters AS c
       SET leased = c.leased - d.n
      FROM (SELECT group_name, count(*) AS n FROM old_rows GROUP BY group_name) AS d
     WHERE c.group_name = d.group_name;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER resgroups_fleet_leases_inserted
    AFTER INSERT ON resgroups_fleet_leases
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION resgroups_fleet_count_inserts();

CREATE OR REPLACE TRIGGER resgroups_fleet_leases_deleted
    AFTER DELETE ON resgroups_fleet_leases
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION resgroups_fleet_count_deletes();

-- one round trip per admission: the group's lock for the call and its commit,
-- the counter read, the lease inserted if below the limit the caller's catalog holds
CREATE OR REPLACE FUNCTION resgroups_fleet_try_acquire(
    p_group text, p_instance text, p_query text, p_max bigint
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_group));
    IF EXISTS (SELECT 1 FROM resgroups_fleet_leases WHERE query_id = p_query) THEN
        RETURN true;  -- a retry of an acquire whose answer was lost
    END IF;
    SELECT leased INTO held FROM resgroups_fleet_counters WHERE group_name = p_group;
    IF coalesce(held, 0) >= p_max THEN
        RETURN false;
    END IF;
    INSERT INTO resgroups_fleet_leases (query_id, group_name, instance_id)
    VALUES (p_query, p_group, p_instance);
    RETURN true;
END
$$;

-- the sweep's repair: a counter that drifted from its rows (rows removed with
-- triggers disabled, a TRUNCATE) is recounted under the group's lock
CREATE OR REPLACE FUNCTION resgroups_fleet_recount(p_group text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    actual bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_group));
    SELECT count(*) INTO actual FROM resgroups_fleet_leases WHERE group_name = p_group;
    INSERT INTO resgroups_fleet_counters AS c (group_name, leased) VALUES (p_group, actual)
    ON CONFLICT (group_name) DO UPDATE SET leased = EXCLUDED.leased;
    RETURN actual;
END
$$;
