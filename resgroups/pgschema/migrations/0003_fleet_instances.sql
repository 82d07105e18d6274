-- Fleet health: each instance's heartbeat, beside its leases. The heartbeat
-- that renews an instance's leases also stamps its row here, so the other
-- instances can tell a live instance from one whose heartbeat lapsed
-- (resource_group_instances()). A clean shutdown deletes its row.
CREATE TABLE IF NOT EXISTS resgroups_fleet_instances (
    instance_id  text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);
