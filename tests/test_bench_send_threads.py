"""The benchmarks size their workers' send pool (`--send-threads`, DISPATCH_SEND_THREADS in the
workers' environment) and print it: the bulk load's threads decide how long an approver's
click waits for the cores (docs/performance.md, the eleventh round)."""

from __future__ import annotations

import pytest
from django.core.management.base import CommandError

from bench.management.commands import bench_approve, bench_dispatch

DB, BROKER = "postgres://postgres@127.0.0.1:5432/postgres", "redis://127.0.0.1:6379/0"


def options(module, *argv: str) -> dict:
    command = module.Command()
    parser = command.create_parser("manage.py", module.__name__.rsplit(".", 1)[-1])
    return vars(parser.parse_args(["--database", "cs_probe", "--redis-db", "3", *argv]))


@pytest.mark.parametrize("module", [bench_dispatch, bench_approve])
def test_the_workers_get_the_send_threads_asked_for(module) -> None:
    default = module.Bench(module.Command(), options(module), DB, BROKER)
    assert default.env()["DISPATCH_SEND_THREADS"] == "2"
    assert default.options["concurrency"] == 1
    asked = module.Bench(module.Command(), options(module, "--send-threads", "16"), DB, BROKER)
    assert asked.env("http://127.0.0.1:9")["DISPATCH_SEND_THREADS"] == "16"


@pytest.mark.parametrize("module", [bench_dispatch, bench_approve])
def test_no_send_threads_is_refused_before_anything_starts(module) -> None:
    baseline = ["--skip-baseline"] if module is bench_dispatch else []
    opts = options(module, "--send-threads", "0", *baseline)
    with pytest.raises(CommandError, match="--send-threads must be at least 1"):
        module.Command().handle(**opts)
