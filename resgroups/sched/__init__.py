"""Scheduling: the admission gate (``admission``), CPU scheduling (``cpu`` and its
threaded ``pool``), memory budgets (``memory``), each group's live state
(``runtime``) and the statistics every view renders (``stats``)."""
