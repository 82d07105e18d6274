-- Every SQL statement of the reference resource-group document, verbatim and in
-- order, separated by blank lines (tests/test_seed_statements.py walks them all).

CREATE RESOURCE GROUP reporting WITH (
cpu_weight = 50,
max_active_queries = 4,
memory_limit = '2G'
);

ALTER USER analyst SET RESOURCE GROUP reporting;

ALTER USER analyst SET RESOURCE GROUP reporting;

ALTER GROUP analysts SET RESOURCE GROUP reporting MAPPING PRIORITY 10;

ALTER SERVICE ACCOUNT ingest_bot SET RESOURCE GROUP reporting;

ALTER GROUP analysts SET RESOURCE GROUP adhoc MAPPING PRIORITY 10;

ALTER GROUP oncall SET RESOURCE GROUP dashboards MAPPING PRIORITY 20;

SET RESOURCE GROUP alerts;

CREATE RESOURCE GROUP reporting WITH (
max_active_queries = 4,
max_queued_queries = 32,
queue_timeout = '15s'
);

CREATE RESOURCE GROUP dashboards WITH (cpu_weight = 100);

CREATE RESOURCE GROUP adhoc WITH (cpu_weight = 50);

CREATE RESOURCE GROUP tenant_a WITH (cpu_limit = '25%');

CREATE RESOURCE GROUP research WITH (scheduling_policy = 'fair');

CREATE RESOURCE GROUP reporting WITH (memory_limit = '8G');
