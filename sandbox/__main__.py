"""Command line entry point.

``python -m sandbox --port 8700 --data-dir var/sandbox [--host H] [--reset] [--quiet]``
"""

from __future__ import annotations

import argparse

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
    args = parser.parse_args(argv)
    serve(
        host=args.host, port=args.port, data_dir=args.data_dir, reset=args.reset, quiet=args.quiet
    )


if __name__ == "__main__":
    main()
