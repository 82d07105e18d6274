"""The ``resgroups`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from resgroups.errors import Error


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resgroups", description="Resource groups for Python query engines."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shell = commands.add_parser("shell", help="an interactive SQL shell (or -c / piped SQL)")
    shell.add_argument("-c", "--command", metavar="SQL", help="run SQL and exit")
    shell.add_argument(
        "--catalog",
        metavar="DIR",
        help="durable catalog directory (created if missing; default: in memory)",
    )
    shell.add_argument(
        "--replica",
        action="store_true",
        help="open --catalog as a read-only replica that follows its primary (DDL is refused)",
    )
    shell.add_argument(
        "--access-control", action="store_true", help="principals, passwords and permissions"
    )
    shell.add_argument("--user", help="log in as this principal (default: the admin)")
    shell.add_argument("--password", help="the principal's password")
    shell.add_argument("--admin-user", default="admin", help="the admin's name (default admin)")
    shell.add_argument("--admin-password", help="the admin's password (default: none)")

    demo = commands.add_parser(
        "demo", help="dashboards vs a nightly report, without and with resource groups"
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="total seconds, split between the two runs (default 20)",
    )
    demo.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    demo.add_argument(
        "--chart", default="resgroups-demo.png", metavar="PATH", help="where to write the PNG chart"
    )
    demo.add_argument("--scenario", default="dashboards", metavar="NAME", help="the scenario")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from resgroups import demo

        return demo.main(
            duration=args.duration,
            as_json=args.json,
            chart_path=args.chart,
            scenario_name=args.scenario,
            out=sys.stdout,
        )
    from resgroups.engine import Engine

    try:
        if args.replica and not args.catalog:
            print("resgroups: --replica follows a catalog: give --catalog DIR", file=sys.stderr)
            return 2
        engine = Engine(
            catalog=args.catalog,
            role="replica" if args.replica else "primary",
            access_control=args.access_control,
            admin_user=args.admin_user,
            admin_password=args.admin_password,
        )
    except Error as exc:
        print(f"resgroups: {exc}", file=sys.stderr)
        return 2
    with engine:
        try:
            session = engine.connect(user=args.user, password=args.password)
        except Error as exc:
            print(f"resgroups: {exc}", file=sys.stderr)
            return 2
        from resgroups import shell

        return shell.main(session, command=args.command)


if __name__ == "__main__":
    sys.exit(main())
