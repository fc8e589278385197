"""Extra tenants (`python -m sandbox --extra-tenant SLUG`): their own orders, warehouse and
addresses after the standard seed, kept across a reset and a restart."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox import make_server
from tests.helpers import ROOT
from tests.sandbox_process import TOKENS


@contextlib.contextmanager
def serving(data_dir: Path, **options: Any) -> Iterator[httpx.Client]:
    server = make_server(port=0, data_dir=data_dir, quiet=True, **options)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            yield client
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        server.store.close()


def orders_of(client: httpx.Client) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for order in client.get("/data").json()["orders"]:
        found.setdefault(order["tenant"], []).append(order["id"])
    return found


def test_an_extra_tenant_gets_its_own_orders_warehouse_and_addresses(tmp_path: Path) -> None:
    with serving(tmp_path, extra_tenants=("initech", "umbrella")) as client:
        orders = orders_of(client)
        assert orders["acme"] == [f"order-{n:03d}" for n in range(1, 16)]  # the seed as before
        assert orders["initech"] == [f"order-{n:03d}" for n in range(21, 41)]
        assert orders["umbrella"] == [f"order-{n:03d}" for n in range(41, 61)]
        auth = {"Authorization": f"Bearer {TOKENS['warehouse']}"}
        warehouse = client.get("/warehouse/warehouses/wh-initech-1", headers=auth).json()
        assert warehouse == {
            "id": "wh-initech-1",
            "tenant": "initech",
            "stock": {"PART-100": 50, "PART-200": 50, "PART-300": 50},
        }
        auth = {"Authorization": f"Bearer {TOKENS['carrier']}"}
        address = client.get("/carrier/addresses/addr-umbrella-005", headers=auth).json()
        assert (address["tenant"], address["valid"]) == ("umbrella", True)

        assert client.post("/reset").status_code == 200
        assert orders_of(client)["umbrella"] == [f"order-{n:03d}" for n in range(41, 61)]

    # A restart on the same data keeps them, and a new name is added after them.
    with serving(tmp_path, extra_tenants=("hooli",)) as client:
        orders = orders_of(client)
        assert orders["initech"][0] == "order-021"
        assert orders["hooli"] == [f"order-{n:03d}" for n in range(61, 81)]


def test_without_extra_tenants_the_seed_is_unchanged(tmp_path: Path) -> None:
    with serving(tmp_path) as client:
        assert set(orders_of(client)) == {"acme", "globex"}
        assert len(client.get("/data").json()["warehouses"]) == 3


@pytest.mark.parametrize("slug", ["acme", "Big Co", ""])
def test_a_bad_or_taken_name_is_refused_on_the_command_line(slug: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sandbox", "--data-dir", str(tmp_path), "--extra-tenant", slug],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "an extra tenant is a new lowercase slug" in result.stderr
