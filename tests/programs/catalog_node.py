"""One engine on a shared catalog, in its own process, for the replication tests.

    python tests/programs/catalog_node.py primary CATALOG --groups 300
    python tests/programs/catalog_node.py replica CATALOG --until 302

``primary`` opens the catalog as its writer and creates resource groups
``g0..g{N-1}`` one DDL statement at a time, printing ``{"version": v,
"at": t}`` after each (``at`` is ``time.time()`` when the statement
returned), then ``{"done": true, "digest": ...}``. With ``--forever`` it
keeps creating groups until it is killed.

``replica`` follows the catalog until it has applied ``--until`` (or forever
without it), printing ``{"version": v, "at": t}`` as versions arrive and,
at the end, the digest of its snapshot. It also runs a managed query first
and reports what it ran in (None: unmanaged, the catalog not there yet).

The digest is the same function the tests apply to any snapshot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog_digest import digest

import resgroups


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def primary(args: argparse.Namespace) -> None:
    with resgroups.Engine(catalog=args.catalog, workers=1) as engine:
        session = engine.connect()
        i = 0
        while args.forever or i < args.groups:
            name = f"{args.prefix}{i}" if not args.forever else f"v{engine.catalog_version}"
            session.execute(f"CREATE RESOURCE GROUP {name} WITH (cpu_weight = {i % 100 + 1})")
            emit(version=engine.catalog_version, at=time.time())
            i += 1
        emit(done=True, version=engine.catalog_version, digest=digest(engine.snapshot))


def replica(args: argparse.Namespace) -> None:
    with resgroups.Engine(catalog=args.catalog, role="replica", workers=1) as engine:
        session = engine.connect()
        first = session.execute("SELECT current_resource_group()").rows[0][0]
        emit(
            started=True,
            version=engine.catalog_version,
            group=first,
            unmanaged=engine.catalog_lag_unmanaged_queries,
        )
        seen = engine.catalog_version
        while args.until is None or engine.catalog_version < args.until:
            if engine.catalog_version != seen:
                seen = engine.catalog_version
                emit(version=seen, at=time.time())
            time.sleep(0.001)
        group = session.execute("SELECT current_resource_group()").rows[0][0]
        emit(
            done=True,
            version=engine.catalog_version,
            at=time.time(),
            group=group,
            unmanaged=engine.catalog_lag_unmanaged_queries,
            digest=digest(engine.snapshot),
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["primary", "replica"])
    parser.add_argument("catalog")
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--prefix", default="g", help="names of the groups a primary creates")
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--until", type=int)
    parsed = parser.parse_args()
    (primary if parsed.role == "primary" else replica)(parsed)
