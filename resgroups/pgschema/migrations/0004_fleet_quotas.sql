-- Fleet quotas (fleet_admission = 'quota'): each instance holds a share of a
-- group's max_active_queries and admits locally within it. One row per
-- (group, instance): the slots it may use (quota) and the slots its queries
-- want now (wanted: running plus queued, capped at the limit). The sum of a
-- group's quotas never exceeds the limit the callers' catalogs hold: only
-- resgroups_fleet_quota_set changes a quota, under the group's advisory lock
-- (the lock the leases use). Rows carry the instance's heartbeat; the sweep
-- deletes those of an instance whose heartbeat lapsed.
CREATE TABLE IF NOT EXISTS resgroups_fleet_quotas (
    group_name  text        NOT NULL,
    instance_id text        NOT NULL,
    quota       bigint      NOT NULL CHECK (quota >= 0),
    wanted      bigint      NOT NULL CHECK (wanted >= 0),
    renewed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_name, instance_id)
);
CREATE INDEX IF NOT EXISTS resgroups_fleet_quotas_by_instance
    ON resgroups_fleet_quotas (instance_id);

-- Ask for p_target slots of p_group (at most p_max fleet-wide), saying that
-- p_wanted are wanted now. Giving back is always granted (the caller stopped
-- using those slots first, and never gives back one a running query holds);
-- taking more is granted as far as the others' quotas leave room. Returns
-- (the quota now held; how much of it the caller may admit on: all of it,
-- unless a lowered limit left the fleet's quotas above it, when only what the
-- others leave below the limit; this instance's fair share of the limit;
-- whether the instances together want more than the limit). NOTIFY
-- 'quota:<group>' when slots were given back, 'want:<group>' when the caller
-- got less than it asked for.
CREATE OR REPLACE FUNCTION resgroups_fleet_quota_set(
    p_group text, p_instance text, p_target bigint, p_wanted bigint, p_max bigint,
    OUT granted bigint, OUT usable bigint, OUT fair bigint, OUT contended boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    others bigint;
    others_wanted bigint;
    mine bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(29287 + 16, hashtext(p_group));
    SELECT coalesce(sum(quota), 0), coalesce(sum(wanted), 0) INTO others, others_wanted
      FROM resgroups_fleet_quotas
     WHERE group_name = p_group AND instance_id <> p_instance;
    SELECT quota INTO mine FROM resgroups_fleet_quotas
     WHERE group_name = p_group AND instance_id = p_instance;
    mine := coalesce(mine, 0);
    IF p_target <= mine THEN
        granted := p_target;
    ELSE
        granted := greatest(mine, least(p_target, p_max - others));
    END IF;
    -- a limit lowered below what the fleet holds: admit on no more than it leaves
    usable := greatest(0, least(granted, p_max - others));
    IF granted = 0 AND p_wanted = 0 THEN
        DELETE FROM resgroups_fleet_quotas
         WHERE group_name = p_group AND instance_id = p_instance;
    ELSE
        INSERT INTO resgroups_fleet_quotas (group_name, instance_id, quota, wanted)
        VALUES (p_group, p_instance, granted, p_wanted)
        ON CONFLICT (group_name, instance_id)
        DO UPDATE SET quota = EXCLUDED.quota, wanted = EXCLUDED.wanted, renewed_at = now();
    END IF;
    contended := others_wanted + p_wanted > p_max;
    IF contended AND p_wanted > 0 THEN
        fair := greatest(1, (p_max * p_wanted) / (others_wanted + p_wanted));
    ELSE
        fair := p_max;
    END IF;
    IF granted < mine THEN
        PERFORM pg_notify('resgroups_fleet', 'quota:' || p_group);
    END IF;
    IF usable < p_target THEN
        PERFORM pg_notify('resgroups_fleet', 'want:' || p_group);
    END IF;
END
$$;
