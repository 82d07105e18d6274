-- Nested groups (SPEC §14): a query of a group nested under limited parents
-- holds a lease at every limited level of its path, one row per level, all
-- under its query id. The key becomes (query_id, group_key), so releasing a
-- query (DELETE ... WHERE query_id = ANY), renewing an instance's rows and the
-- sweep keep working on every level at once, and the counters follow each
-- level through the triggers as before.
ALTER TABLE resgroups_fleet_leases DROP CONSTRAINT resgroups_fleet_leases_pkey;
ALTER TABLE resgroups_fleet_leases ADD PRIMARY KEY (query_id, group_key);

-- a flat group: as before, the retry check on this group's row alone
CREATE OR REPLACE FUNCTION resgroups_fleet_try_acquire(
    p_key text, p_name text, p_instance text, p_query text, p_max bigint,
    p_catalog text, p_since bigint, p_expiry double precision, p_version bigint
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_key));
    IF EXISTS (SELECT 1 FROM resgroups_fleet_leases
                WHERE query_id = p_query AND group_key = p_key) THEN
        RETURN true;  -- a retry of an acquire whose answer was lost
    END IF;
    IF p_since > 0 THEN  -- a limit that appeared: only then is the barrier read
        IF resgroups_fleet_behind(p_catalog, p_since, p_expiry) THEN
            RETURN false;
        END IF;
    END IF;
    IF resgroups_fleet_ahead(p_catalog, p_version, p_expiry) THEN
        RETURN false;  -- this caller's catalog lags: its limit may be an old one
    END IF;
    SELECT leased INTO held FROM resgroups_fleet_counters WHERE group_key = p_key;
    IF coalesce(held, 0) >= p_max THEN
        RETURN false;
    END IF;
    INSERT INTO resgroups_fleet_leases (query_id, group_key, group_name, instance_id)
    VALUES (p_query, p_key, p_name, p_instance);
    RETURN true;
END
$$;

-- every limited level of a path at once, or none: the levels' locks are taken
-- root first (p_keys is root first), each level's counter read, and a row per
-- level inserted only when every level is below the limit the caller's catalog
-- holds and no live instance is behind a limit that appeared
CREATE OR REPLACE FUNCTION resgroups_fleet_try_acquire_path(
    p_keys text[], p_names text[], p_instance text, p_query text, p_maxes bigint[],
    p_catalog text, p_sinces bigint[], p_expiry double precision, p_version bigint
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
    i int;
BEGIN
    FOR i IN 1 .. array_length(p_keys, 1) LOOP
        PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_keys[i]));
    END LOOP;
    IF (SELECT count(*) FROM resgroups_fleet_leases
         WHERE query_id = p_query AND group_key = ANY(p_keys)) = array_length(p_keys, 1) THEN
        RETURN true;  -- a retry of an acquire whose answer was lost
    END IF;
    IF resgroups_fleet_ahead(p_catalog, p_version, p_expiry) THEN
        RETURN false;
    END IF;
    FOR i IN 1 .. array_length(p_keys, 1) LOOP
        IF p_sinces[i] > 0 AND resgroups_fleet_behind(p_catalog, p_sinces[i], p_expiry) THEN
            RETURN false;
        END IF;
        SELECT leased INTO held FROM resgroups_fleet_counters WHERE group_key = p_keys[i];
        IF coalesce(held, 0) >= p_maxes[i] THEN
            RETURN false;
        END IF;
    END LOOP;
    INSERT INTO resgroups_fleet_leases (query_id, group_key, group_name, instance_id)
    SELECT p_query, k, n, p_instance FROM unnest(p_keys, p_names) AS t(k, n)
    ON CONFLICT (query_id, group_key) DO NOTHING;
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION resgroups_fleet_adopt(
    p_key text, p_name text, p_instance text, p_queries text[]
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    added bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_key));
    INSERT INTO resgroups_fleet_leases (query_id, group_key, group_name, instance_id)
    SELECT q, p_key, p_name, p_instance FROM unnest(p_queries) AS q
    ON CONFLICT (query_id, group_key) DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;
