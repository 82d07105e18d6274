-- run by tests/test_server_wire.py through psql; its output is compared whole
CREATE RESOURCE GROUP dashboards WITH (max_active_queries = 4, cpu_weight = 80);
CREATE RESOURCE GROUP reports WITH (max_active_queries = 1, max_queued_queries = 2);
SET RESOURCE GROUP reports;
SELECT current_resource_group();
SELECT count(*), sum(x), min(x), max(x) FROM long_sequence(3000000);
SELECT x, x * 2 AS twice FROM long_sequence(5) WHERE x > 2 ORDER BY x DESC;
RESET ALL;
SELECT current_resource_group();
SELECT name, max_active_queries, max_queued_queries, cpu_weight, active_queries, admitted_total
  FROM resource_groups() ORDER BY name;
BEGIN;
SHOW client_encoding;
COMMIT;
SELECT x FROM long_sequence(3) WHERE y = 1;
SELECT 'still here' AS status;
