"""A canonical text of a catalog snapshot: equal digests, equal catalogs.

Used by the replication tests and by their helper processes
(tests/programs/catalog_node.py), so a snapshot in one process can be
compared with one in another.
"""

from __future__ import annotations

import hashlib
import json

from resgroups.catalog import Snapshot


def canonical(snap: Snapshot) -> str:
    groups = [[g.id, g.name, g.quoted, dict(sorted(g.params.items()))] for g in snap.groups]
    principals = [
        [
            p.id,
            p.kind.value,
            p.name,
            p.quoted,
            p.password_hash,
            p.memory_limit,
            p.group_id,
            p.priority,
            p.admin,
            p.use_all,
            sorted(p.use_groups),
        ]
        for p in sorted(snap.principals.values(), key=lambda p: p.id)
    ]
    return json.dumps(
        {
            "version": snap.version,
            "next_id": snap.next_id,
            "groups": groups,
            "principals": principals,
            "memberships": sorted(snap.memberships),
            "assume": sorted(snap.assume_grants),
        },
        sort_keys=True,
    )


def digest(snap: Snapshot) -> str:
    return hashlib.sha256(canonical(snap).encode()).hexdigest()
