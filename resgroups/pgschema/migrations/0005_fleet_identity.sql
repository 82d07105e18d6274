-- The fleet's rows keyed by the group's identity, never its name (SPEC §11):
-- group_key holds GroupDef.uid ('1@2:capped': id, creating version, name), which
-- survives RENAME and is new after DROP + CREATE. Rows written before this
-- migration keep their name as their key: no engine of this version asks for
-- that key again, so they are released by query id or expire as before, and
-- the counters follow them through the triggers. group_name stays as a label
-- (the name when the row was written), for people reading the tables.
ALTER TABLE resgroups_fleet_leases RENAME COLUMN group_name TO group_key;
ALTER TABLE resgroups_fleet_leases ADD COLUMN group_name text;
UPDATE resgroups_fleet_leases SET group_name = group_key;
ALTER TABLE resgroups_fleet_counters RENAME COLUMN group_name TO group_key;
ALTER TABLE resgroups_fleet_quotas RENAME COLUMN group_name TO group_key;
ALTER TABLE resgroups_fleet_quotas ADD COLUMN group_name text;
UPDATE resgroups_fleet_quotas SET group_name = group_key;
-- when the row's quota last went from none to some: how long its turn has run
ALTER TABLE resgroups_fleet_quotas ADD COLUMN held_since timestamptz NOT NULL DEFAULT now();
-- since when the row has wanted slots and held none: freed slots go to the
-- instances that have waited longest first (NULL: not waiting)
ALTER TABLE resgroups_fleet_quotas ADD COLUMN waiting_since timestamptz;

-- A limit that appears (ALTER from no limit) must count the queries admitted
-- before it, which hold no lease and no quota. Each instance adopts its own
-- (a lease or a quota for each) and then says so: catalog_version is the
-- version through which it has, and catalog_uid the log it follows. Until
-- every live instance of that log has reached the version at which a group's
-- limit appeared, nobody is admitted on that limit.
ALTER TABLE resgroups_fleet_instances ADD COLUMN catalog_uid text NOT NULL DEFAULT '';
ALTER TABLE resgroups_fleet_instances ADD COLUMN catalog_version bigint NOT NULL DEFAULT 0;
-- Each instance's own lease_expiry and admission mode, sent with its heartbeat:
-- its rows are reclaimed only past ITS expiry (the sweep owner's may be shorter),
-- and an instance whose mode differs from an older live instance's admits
-- nothing (leases and quotas do not see each other).
ALTER TABLE resgroups_fleet_instances ADD COLUMN expiry double precision NOT NULL DEFAULT 0;
ALTER TABLE resgroups_fleet_instances ADD COLUMN admission text NOT NULL DEFAULT '';

CREATE OR REPLACE FUNCTION resgroups_fleet_count_inserts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO resgroups_fleet_counters AS c (group_key, leased)
    SELECT group_key, count(*) FROM new_rows GROUP BY group_key ORDER BY group_key
    ON CONFLICT (group_key) DO UPDATE SET leased = c.leased + EXCLUDED.leased;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION resgroups_fleet_count_deletes() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM resgroups_fleet_counters
     WHERE group_key IN (SELECT DISTINCT group_key FROM old_rows)
     ORDER BY group_key
       FOR UPDATE;
    UPDATE resgroups_fleet_counters AS c
       SET leased = c.leased - d.n
      FROM (SELECT group_key, count(*) AS n FROM old_rows GROUP BY group_key) AS d
     WHERE c.group_key = d.group_key;
    RETURN NULL;
END
$$;

-- true while a live instance (a heartbeat within its expiry, and p_expiry) following
-- log p_catalog has not yet adopted its queries through version p_since
CREATE OR REPLACE FUNCTION resgroups_fleet_behind(
    p_catalog text, p_since bigint, p_expiry double precision
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_since > 0 AND EXISTS (
        SELECT 1 FROM resgroups_fleet_instances
         WHERE catalog_uid = p_catalog AND catalog_version < p_since
           AND heartbeat_at > now() - make_interval(secs => greatest(p_expiry, expiry)))
$$;

-- true while a live instance of log p_catalog has applied a later version than
-- p_version: a caller whose catalog lags (a pause, a slow follower) waits until
-- it has caught up, so it never admits under a limit the fleet has lowered
CREATE OR REPLACE FUNCTION resgroups_fleet_ahead(
    p_catalog text, p_version bigint, p_expiry double precision
) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT p_catalog <> '' AND EXISTS (
        SELECT 1 FROM resgroups_fleet_instances
         WHERE catalog_uid = p_catalog AND catalog_version > p_version
           AND heartbeat_at > now() - make_interval(secs => greatest(p_expiry, expiry)))
$$;

DROP FUNCTION IF EXISTS resgroups_fleet_try_acquire(text, text, text, bigint);
-- one round trip per admission: the group's lock for the call and its commit,
-- the counter read, the lease inserted if below the limit the caller's catalog
-- holds and every live instance has adopted what it ran before that limit
CREATE OR REPLACE FUNCTION resgroups_fleet_try_acquire(
    p_key text, p_name text, p_instance text, p_query text, p_max bigint,
    p_catalog text, p_since bigint, p_expiry double precision, p_version bigint
) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    held bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_key));
    IF EXISTS (SELECT 1 FROM resgroups_fleet_leases WHERE query_id = p_query) THEN
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

-- a limit appeared: leases for the queries this instance admitted before it,
-- whatever the count (they run already); the group's lock keeps acquires out
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
    ON CONFLICT (query_id) DO NOTHING;
    GET DIAGNOSTICS added = ROW_COUNT;
    RETURN added;
END
$$;

DROP FUNCTION IF EXISTS resgroups_fleet_recount(text);
CREATE OR REPLACE FUNCTION resgroups_fleet_recount(p_key text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    actual bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_key));
    SELECT count(*) INTO actual FROM resgroups_fleet_leases WHERE group_key = p_key;
    INSERT INTO resgroups_fleet_counters AS c (group_key, leased) VALUES (p_key, actual)
    ON CONFLICT (group_key) DO UPDATE SET leased = EXCLUDED.leased;
    RETURN actual;
END
$$;

DROP FUNCTION IF EXISTS resgroups_fleet_quota_set(text, text, bigint, bigint, bigint);
-- Quota mode (0004), keyed by identity, with two additions for a limit that
-- appeared: p_floor, the queries this instance runs in the group now (its
-- quota is never set below them: they run already, admitted before the
-- limit), and the barrier above: while an instance of the log is behind
-- p_since, nothing of the quota is usable. And turns: when the limit is
-- smaller than the instances that want it (this one's exact share below one
-- slot), an instance that has held its slots for p_hold seconds while another
-- waits with none is told a fair share of 0, so it gives them back and the
-- waiting one takes them; it asks again after p_hold. Freed slots go to the
-- instances that have waited with none longest first (waiting_since).
CREATE OR REPLACE FUNCTION resgroups_fleet_quota_set(
    p_key text, p_name text, p_instance text, p_target bigint, p_wanted bigint, p_max bigint,
    p_floor bigint, p_catalog text, p_since bigint, p_expiry double precision,
    p_version bigint, p_hold double precision,
    OUT granted bigint, OUT usable bigint, OUT fair bigint, OUT contended boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    others bigint;
    others_wanted bigint;
    mine bigint;
    mine_since timestamptz;
    mine_waiting timestamptz;
    older bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_key));
    SELECT coalesce(sum(quota), 0), coalesce(sum(wanted), 0) INTO others, others_wanted
      FROM resgroups_fleet_quotas
     WHERE group_key = p_key AND instance_id <> p_instance;
    SELECT quota, held_since, waiting_since INTO mine, mine_since, mine_waiting
      FROM resgroups_fleet_quotas
     WHERE group_key = p_key AND instance_id = p_instance;
    mine := coalesce(mine, 0);
    -- instances that have waited with none for longer than this one: a slot each
    SELECT count(*) INTO older FROM resgroups_fleet_quotas
     WHERE group_key = p_key AND instance_id <> p_instance AND quota = 0 AND wanted > 0
       AND waiting_since < coalesce(mine_waiting, now());
    IF p_target <= mine THEN
        granted := p_target;
    ELSE
        granted := greatest(mine, least(p_target, p_max - others - older));
    END IF;
    granted := greatest(granted, p_floor);
    -- a limit lowered below what the fleet holds: admit on no more than it leaves
    usable := greatest(0, least(granted, p_max - others));
    IF p_since > 0 THEN
        IF resgroups_fleet_behind(p_catalog, p_since, p_expiry) THEN
            usable := 0;
        END IF;
    END IF;
    IF resgroups_fleet_ahead(p_catalog, p_version, p_expiry) THEN
        usable := least(usable, mine);  -- a lagging catalog: nothing more for now
    END IF;
    IF granted = 0 AND p_wanted = 0 THEN
        DELETE FROM resgroups_fleet_quotas
         WHERE group_key = p_key AND instance_id = p_instance;
    ELSE
        INSERT INTO resgroups_fleet_quotas AS q
            (group_key, group_name, instance_id, quota, wanted, waiting_since)
        VALUES (p_key, p_name, p_instance, granted, p_wanted,
                CASE WHEN granted = 0 AND p_wanted > 0 THEN now() END)
        ON CONFLICT (group_key, instance_id)
        DO UPDATE SET quota = EXCLUDED.quota, wanted = EXCLUDED.wanted,
                      group_name = EXCLUDED.group_name, renewed_at = now(),
                      held_since = CASE WHEN q.quota = 0 AND EXCLUDED.quota > 0
                                        THEN now() ELSE q.held_since END,
                      waiting_since = CASE WHEN EXCLUDED.quota = 0 AND EXCLUDED.wanted > 0
                                           THEN coalesce(q.waiting_since, now()) END;
    END IF;
    contended := others_wanted + p_wanted > p_max;
    IF contended AND p_wanted > 0 THEN
        fair := greatest(1, (p_max * p_wanted) / (others_wanted + p_wanted));
        IF p_max * p_wanted < others_wanted + p_wanted AND mine > 0
           AND mine_since < now() - make_interval(secs => p_hold)
           AND EXISTS (SELECT 1 FROM resgroups_fleet_quotas
                        WHERE group_key = p_key AND instance_id <> p_instance
                          AND quota = 0 AND wanted > 0) THEN
            fair := 0;  -- its turn is over: another waits with none
        END IF;
    ELSE
        fair := p_max;
    END IF;
    IF granted < mine THEN
        PERFORM pg_notify('resgroups_fleet', 'quota:' || p_key);
    END IF;
    IF usable < p_target THEN
        PERFORM pg_notify('resgroups_fleet', 'want:' || p_key);
    END IF;
END
$$;
