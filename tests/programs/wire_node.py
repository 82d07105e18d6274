"""A wire protocol listener in its own process, with the limits a test names.

    python tests/programs/wire_node.py [--query-timeout S] [--workers N]
        [--threads N] [--max-connections N] [--write-timeout S]
        [--throttle FREE] [--access-control] [--memory-limit BYTES]

It prints ``{"port": p, "pid": pid}`` once it listens, then serves until
SIGTERM. The engine and :class:`~resgroups.server.pgwire.Backend` are made
here, not by ``resgroups serve``, so that a test can set what the command
line does not (yet) take. Tests start it under an address-space limit
(``RLIMIT_AS``), so a regression that allocates without bound fails with
MemoryError in this process instead of exhausting the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal

from resgroups import Engine
from resgroups.server.limits import LoginThrottle, RequestThreads
from resgroups.server.pgwire import Backend


async def main(args: argparse.Namespace) -> None:
    engine = Engine(
        workers=args.workers,
        query_timeout=args.query_timeout,
        access_control=args.access_control,
        admin_password=os.environ.get("RESGROUPS_ADMIN_PASSWORD"),
        process_memory_limit=args.memory_limit,
    )
    threads = RequestThreads(args.threads)
    throttle = LoginThrottle(free=args.throttle, window_s=60.0) if args.throttle else None
    backend = Backend(
        engine,
        threads,
        auth_method="password" if args.access_control else "scram-sha-256",
        max_connections=args.max_connections,
        throttle=throttle,
        write_timeout=args.write_timeout,
    )
    server = await asyncio.start_server(backend.handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    backend.closing = True
    engine.close(1.0)
    threads.shutdown(wait=False, cancel_futures=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--query-timeout", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--max-connections", type=int, default=None)
    parser.add_argument("--write-timeout", type=float, default=60.0)
    parser.add_argument("--throttle", type=int, default=0)
    parser.add_argument("--access-control", action="store_true")
    parser.add_argument("--memory-limit", type=int, default=0)
    logging.basicConfig(level=logging.WARNING, format="wire_node: %(levelname)s %(message)s")
    asyncio.run(main(parser.parse_args()))
