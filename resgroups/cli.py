"""The ``resgroups`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from resgroups.errors import Error

if TYPE_CHECKING:
    from resgroups.engine import Engine


def _engine_arguments(command: argparse.ArgumentParser, catalog_help: str) -> None:
    """The engine's arguments the shell and the servers share."""
    command.add_argument("--catalog", metavar="DIR|postgresql://...", help=catalog_help)
    command.add_argument(
        "--replica",
        action="store_true",
        help="open --catalog as a read-only replica that follows its primary (DDL is refused)",
    )
    command.add_argument(
        "--access-control", action="store_true", help="principals, passwords and permissions"
    )
    command.add_argument("--admin-user", default="admin", help="the admin's name (default admin)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resgroups", description="Resource groups for Python query engines."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    shell = commands.add_parser("shell", help="an interactive SQL shell (or -c / piped SQL)")
    shell.add_argument("-c", "--command", metavar="SQL", help="run SQL and exit")
    _engine_arguments(shell, "durable catalog directory (created if missing; default: in memory)")
    shell.add_argument("--user", help="log in as this principal (default: the admin)")
    shell.add_argument("--password", help="the principal's password")
    shell.add_argument("--admin-password", help="the admin's password (default: none)")

    serve = commands.add_parser(
        "serve", help="PostgreSQL wire protocol and HTTP servers over one engine"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument(
        "--pg-port", type=int, default=8812, help="PostgreSQL wire protocol port (8812; 0: any)"
    )
    serve.add_argument("--http-port", type=int, default=9000, help="HTTP port (9000; 0: any)")
    _engine_arguments(
        serve, "durable catalog: a directory or a PostgreSQL database (default: in memory)"
    )
    serve.add_argument(
        "--coordination",
        metavar="postgresql://...",
        help="fleet-wide admission through this PostgreSQL database",
    )
    serve.add_argument("--workers", type=int, help="shared pool size (default: the CPUs)")
    serve.epilog = "With --access-control the admin's password comes from RESGROUPS_ADMIN_PASSWORD."
    serve.add_argument(
        "--auth-method",
        choices=("scram-sha-256", "md5", "password"),
        default="scram-sha-256",
        help="wire protocol password exchange with access control on (scram-sha-256)",
    )
    serve.add_argument(
        "--grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, how long running queries may finish (30)",
    )

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
    demo.add_argument(
        "--scenario",
        default="dashboards",
        metavar="NAME",
        help="dashboards (the built-in executor, default) or duckdb (DuckDB tables)",
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="serve the run with groups (the live page at /, the wire protocol) "
        "and keep its engine up after the runs, until Ctrl-C",
    )
    demo.add_argument("--host", default="127.0.0.1", help="with --serve: the address (127.0.0.1)")
    demo.add_argument("--http-port", type=int, default=9000, help="with --serve: HTTP (9000)")
    demo.add_argument(
        "--pg-port", type=int, default=8812, help="with --serve: the wire protocol (8812)"
    )
    return parser


class _ServedDemo:
    """The demo's engine behind ``resgroups serve``'s servers (``demo --serve``)."""

    def __init__(self, engine: Engine, args: argparse.Namespace) -> None:
        from resgroups.server.app import BackgroundServer

        self._server = BackgroundServer(
            engine, host=args.host, pg_port=args.pg_port, http_port=args.http_port
        )
        listeners = self._server.start()
        self.url = f"http://{listeners.host}:{listeners.http_port}/"

    def wait(self) -> None:
        import signal
        import time

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # no lock taken: the main thread unwinds

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)

    def close(self) -> None:
        self._server.stop(grace=1.0)


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
            serve=(lambda engine: _ServedDemo(engine, args)) if args.serve else None,
        )
    if args.command == "serve":
        return _serve(args)
    engine = _open_engine(args, args.admin_password)
    if engine is None:
        return 2
    with engine:
        try:
            session = engine.connect(user=args.user, password=args.password)
        except Error as exc:
            print(f"resgroups: {exc}", file=sys.stderr)
            return 2
        from resgroups import shell

        return shell.main(session, command=args.command)


def _open_engine(
    args: argparse.Namespace, admin_password: str | None, **extra: Any
) -> Engine | None:
    """The engine the command's arguments describe; None (said on stderr) if they are wrong."""
    from resgroups.engine import Engine

    if args.replica and not args.catalog:
        print("resgroups: --replica follows a catalog: give --catalog", file=sys.stderr)
        return None
    try:
        return Engine(
            catalog=args.catalog,
            role="replica" if args.replica else "primary",
            access_control=args.access_control,
            admin_user=args.admin_user,
            admin_password=admin_password,
            **extra,
        )
    except Error as exc:
        print(f"resgroups: {exc}", file=sys.stderr)
        return None


def _serve(args: argparse.Namespace) -> int:
    import logging
    import os

    from resgroups.server.app import Listeners, serve

    logging.basicConfig(level=logging.WARNING, format="resgroups: %(levelname)s %(message)s")
    password = os.environ.get("RESGROUPS_ADMIN_PASSWORD") or None
    engine = _open_engine(
        args,
        password,
        coordination=args.coordination,
        workers=args.workers,
        md5_passwords=args.auth_method == "md5",
    )
    if engine is None:
        return 2

    def ready(listeners: Listeners) -> None:
        print(listeners.describe(), flush=True)

    try:
        return serve(
            engine,
            host=args.host,
            pg_port=args.pg_port,
            http_port=args.http_port,
            auth_method=args.auth_method,
            grace=args.grace,
            ready=ready,
        )
    except OSError as exc:
        print(f"resgroups: cannot listen: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
