"""Fleet mode (SPEC §11): ``max_active_queries`` held across every process of a
fleet through PostgreSQL: the admission modes an engine chooses from
(``modes``), leases and quotas in the database (``store``), releases off the
query path (``releases``), the coordinator with its heartbeat and sweep
(``coordinator``), this instance's share of each limit (``quotas``), and the
fence that says until when what it holds is its own (``fence``)."""
