"""The ``resgroups`` command."""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from resgroups.errors import Error

if TYPE_CHECKING:
    from resgroups.engine import Engine


# ---- values of the engine's options, checked as Engine() checks them -----------------

_MAX_THREADS: Final = 4096  # Engine(workers=...)'s bound
_UNITS: Final = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}  # fmt: skip
_SIZE: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")
_NONE: Final = ("none", "off")


def _seconds(*, none: bool, unit: str = "seconds") -> Callable[[str], float | None]:
    """A finite number > 0 (of ``unit``); with ``none``, also ``none`` for no limit."""
    allowed = f"{unit} > 0" + (", or none" if none else "")

    def parse(text: str) -> float | None:
        if none and text.strip().lower() in _NONE:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}")
        return value

    return parse


def _bytes(*, zero: str | None = None, none: bool = False) -> Callable[[str], int | None]:
    """A size in bytes: an integer with an optional unit (KB, MB, GB: powers of 1000;
    K, M, G, KiB, MiB, GiB: powers of 1024); ``zero`` says what 0 means
    (None: 0 is refused); with ``none``, also ``none``."""
    allowed = "bytes > 0" if zero is None else f"bytes >= 0 (0: {zero})"
    allowed += ", or none" if none else ""
    allowed += ", e.g. 268435456, 256MiB or 2GB"

    def parse(text: str) -> int | None:
        if none and text.strip().lower() in _NONE:
            return None
        match = _SIZE.fullmatch(text)
        unit = _UNITS.get(match.group(2).lower()) if match else None
        if match is None or unit is None:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}")
        value = float(match.group(1)) * unit
        if value != int(value) or not (value > 0 or (value == 0 and zero is not None)):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}")
        return int(value)

    return parse


def _count(low: int, high: int | None = None) -> Callable[[str], int]:
    allowed = f"an integer {low}..{high}" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}")
        return value

    return parse


def _instance_id(text: str) -> str:
    if not text.strip() or not text.isprintable() or len(text) > 200:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: expected a name of 1..200 printable characters"
        )
    return text


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
    limits = command.add_argument_group("the engine's limits (Engine options of the same names)")
    limits.add_argument(
        "--query-timeout",
        type=_seconds(none=True),
        default=60.0,
        metavar="SECONDS|none",
        help="instance-wide query timeout (60; none: no timeout)",
    )
    limits.add_argument(
        "--query-memory-limit",
        type=_bytes(none=True),
        metavar="BYTES|none",
        help="default single-query memory ceiling, e.g. 1GiB (default: none)",
    )
    limits.add_argument(
        "--process-memory-limit",
        type=_bytes(zero="none"),
        default=0,
        metavar="BYTES",
        help="process budget for tracked query memory, e.g. 8GiB (0: none, the default)",
    )
    limits.add_argument(
        "--slice-ms",
        type=_seconds(none=False, unit="milliseconds"),
        default=10.0,
        metavar="MS",
        help="CPU slice length in milliseconds (10)",
    )
    limits.add_argument(
        "--instance-id",
        type=_instance_id,
        metavar="NAME",
        help="this process's fleet identity (default: host, pid and a random suffix)",
    )


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
        "--pg-port",
        type=_count(0, 65535),
        default=8812,
        help="PostgreSQL wire protocol port (8812; 0: any)",
    )
    serve.add_argument(
        "--http-port", type=_count(0, 65535), default=9000, help="HTTP port (9000; 0: any)"
    )
    serve.add_argument(
        "--admin-port",
        type=_count(0, 65535),
        metavar="PORT",
        help="a PostgreSQL wire protocol port of its own for RESOURCE GROUP ADMIN "
        "principals, served apart from the other clients (default: none; 0: any)",
    )
    _engine_arguments(
        serve, "durable catalog: a directory or a PostgreSQL database (default: in memory)"
    )
    serve.add_argument(
        "--coordination",
        metavar="postgresql://...",
        help="fleet-wide admission through this PostgreSQL database",
    )
    serve.add_argument(
        "--fleet-admission",
        choices=("lease", "quota"),
        default="lease",
        help="with --coordination: a lease per query (lease, the default) or a share "
        "of each limit per process (quota)",
    )
    serve.add_argument(
        "--workers",
        type=_count(1, _MAX_THREADS),
        metavar="N",
        help="shared pool size (default: the CPUs)",
    )
    serve.add_argument(
        "--max-connections",
        type=_count(1),
        metavar="N",
        help="connections at once, wire sessions and running HTTP requests together, "
        "3 of them kept for RESOURCE GROUP ADMIN principals (default: no cap)",
    )
    serve.add_argument(
        "--request-threads",
        type=_count(1, _MAX_THREADS),
        default=256,
        metavar="N",
        help="threads that run both listeners' requests (256), besides 4 kept for "
        "RESOURCE GROUP ADMIN principals",
    )
    serve.add_argument(
        "--max-http-sockets",
        type=_count(8),
        metavar="N",
        help="HTTP sockets open at once; at the cap the idle ones are closed, oldest "
        "first (default: half the descriptors the process may open)",
    )
    serve.add_argument(
        "--metrics-open",
        action="store_true",
        help="with --access-control: serve /metrics without a login (a scraper on a "
        "private network); by default it needs a RESOURCE GROUP ADMIN's login",
    )
    serve.add_argument(
        "--http-keepalive-timeout",
        type=_seconds(none=False),
        default=15.0,
        metavar="SECONDS",
        help="an idle HTTP connection, or one still sending its request's headers, "
        "is closed after this (15)",
    )
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
        help="dashboards (the built-in executor, default), or the same on an embedded engine: "
        "duckdb, datafusion, polars or sqlite",
    )
    demo.add_argument(
        "--serve",
        action="store_true",
        help="serve the run with groups (the live page at /, the wire protocol) "
        "and keep its engine up after the runs, until Ctrl-C",
    )
    demo.add_argument(
        "--oversubscribe",
        type=float,
        default=1.0,
        metavar="FACTOR",
        help="the engine's oversubscribe (1 to 16; default 1): with 2, each pool runs twice "
        "its workers while scheduling is engaged, so priority lanes act (docs/cpu.md)",
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
        self.url = listeners.page

    def wait(self, ready: Callable[[], None]) -> None:
        import signal
        import time

        def stop(signum: int, frame: object) -> None:
            raise KeyboardInterrupt  # no lock taken: the main thread unwinds

        previous = signal.signal(signal.SIGTERM, stop)
        try:
            ready()  # the user is told only once a SIGTERM is heard
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
            oversubscribe=args.oversubscribe,
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
            query_timeout=args.query_timeout,
            query_memory_limit=args.query_memory_limit,
            process_memory_limit=args.process_memory_limit,
            slice_ms=args.slice_ms,
            instance_id=args.instance_id,
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
    if args.fleet_admission == "quota" and not args.coordination:
        print(
            "resgroups serve: error: argument --fleet-admission: 'quota' shares each limit "
            "among the processes of a fleet: give --coordination postgresql://... too "
            "(or --fleet-admission lease)",
            file=sys.stderr,
        )
        return 2
    password = os.environ.get("RESGROUPS_ADMIN_PASSWORD") or None
    engine = _open_engine(
        args,
        password,
        coordination=args.coordination,
        fleet_admission=args.fleet_admission,
        workers=args.workers,
        md5_passwords=args.auth_method == "md5",
    )
    if engine is None:
        return 2

    def ready(listeners: Listeners) -> None:
        print(listeners.describe(), flush=True)
        print(f"the live page: {listeners.page}", flush=True)

    try:
        return serve(
            engine,
            host=args.host,
            pg_port=args.pg_port,
            http_port=args.http_port,
            auth_method=args.auth_method,
            grace=args.grace,
            ready=ready,
            max_connections=args.max_connections,
            max_requests=args.request_threads,
            metrics_open=args.metrics_open,
            keepalive_timeout=args.http_keepalive_timeout,
            max_http_sockets=args.max_http_sockets,
            admin_port=args.admin_port,
        )
    except OSError as exc:
        print(f"resgroups: cannot listen: {exc}", file=sys.stderr)
        return 2
    finally:
        engine.close()


if __name__ == "__main__":
    sys.exit(main())
