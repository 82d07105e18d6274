"""Fleet mode (SPEC §11): ``max_active_queries`` held across every process of a
fleet through PostgreSQL: leases (``store``), releases off the query path
(``releases``), and the coordinator that an engine's queries call
(``coordinator``)."""
