"""Command line entry point.

``python -m sandbox --port 8700 --data-dir var/sandbox [--host H] [--reset] [--quiet]
[--extra-tenant SLUG ...]``
"""

from __future__ import annotations

import argparse

from .seed import check_extra_tenants
from .server import serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description="Run the Countersign sandbox (simulated external systems).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8700, help="0 picks a free port")
    parser.add_argument("--data-dir", default="var/sandbox", help="where the SQLite file lives")
    parser.add_argument("--reset", action="store_true", help="re-seed all data on start")
    parser.add_argument("--quiet", action="store_true", help="no per-request log lines")
    parser.add_argument(
        "--extra-tenant",
        action="append",
        default=[],
        metavar="SLUG",
        help="seed another tenant's orders, warehouse and addresses (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        check_extra_tenants(args.extra_tenant)
    except ValueError as error:
        parser.error(str(error))
    serve(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        reset=args.reset,
        quiet=args.quiet,
        extra_tenants=tuple(args.extra_tenant),
    )


if __name__ == "__main__":
    main()
