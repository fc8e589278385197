"""Fixtures that run the sandbox as a real subprocess and talk HTTP to it (black-box tests)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Repeated here rather than imported: the tests check the published contract, not the code.
TOKENS = {
    "payments": "dev-payments-key",
    "warehouse": "dev-warehouse-key",
    "carrier": "dev-carrier-key",
    "mailer": "dev-mailer-key",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Sandbox:
    """One sandbox process on a data dir; can be stopped and started again on the same dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / "sandbox.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.http: httpx.Client | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        command = [
            sys.executable,
            "-m",
            "sandbox",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).json() == {"ok": True}:
                    self.http = httpx.Client(base_url=self.url, timeout=5.0)
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"sandbox did not become healthy:\n{self.log_path.read_text()}")

    def stop(self) -> int:
        """SIGTERM and wait; returns the exit code (0 for a clean stop)."""
        if self.http is not None:
            self.http.close()
            self.http = None
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    # -- HTTP helpers ------------------------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        assert self.http is not None, "sandbox not started"
        return self.http

    def post(
        self,
        system: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        request_id: str | None = "req-1",
        key: str | None = None,
        token: str | None = None,
        timeout: float = 5.0,
        client: httpx.Client | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or TOKENS[system]}"}
        if request_id is not None:
            headers["X-Request-Id"] = request_id
        if key is not None:
            headers["Idempotency-Key"] = key
        return (client or self.client).post(
            f"/{system}{path}", json=body or {}, headers=headers, timeout=timeout
        )

    def get(
        self,
        system: str,
        path: str,
        params: dict[str, str] | None = None,
        *,
        token: str | None = None,
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or TOKENS[system]}"}
        return self.client.get(f"/{system}{path}", params=params, headers=headers)

    def ledger(self, system: str | None = None) -> list[dict[str, Any]]:
        params = {"system": system} if system else None
        response = self.client.get("/ledger", params=params)
        assert response.status_code == 200
        effects: list[dict[str, Any]] = response.json()["effects"]
        return effects

    def set_faults(self, **spec: Any) -> dict[str, Any]:
        response = self.client.post("/faults", json=spec)
        assert response.status_code == 200, response.text
        faults: dict[str, Any] = response.json()
        return faults

    def order(self, order_id: str) -> dict[str, Any]:
        response = self.get("payments", f"/orders/{order_id}")
        assert response.status_code == 200
        order: dict[str, Any] = response.json()
        return order


@pytest.fixture
def sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(tmp_path / "sandbox-data")
    box.data_dir.mkdir()
    box.start()
    try:
        yield box
    finally:
        box.stop()
