"""The sandbox (the simulated external systems) as a real process: the one way tests start it.

The `sandbox` fixture (tests/conftest.py) gives every test that asks for it the same process,
freshly reset, wired into settings. Tests of the product read its ledger and inject faults;
the sandbox's own tests (tests/sandbox/) speak its published HTTP API through `post` and `get`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ROOT, free_port

# Repeated from sandbox/README.md rather than imported: the tests check the published
# contract, not the code.
TOKENS = {
    "payments": "dev-payments-key",
    "warehouse": "dev-warehouse-key",
    "carrier": "dev-carrier-key",
    "mailer": "dev-mailer-key",
}


class Sandbox:
    """One sandbox process on one data dir and one port; it can be stopped and started
    again on both, keeping its state (as a restarted system would)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir / "sandbox.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self._client: httpx.Client | None = None

    # --- the process ------------------------------------------------------------------------

    def start(self) -> Sandbox:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "sandbox", "--port", str(self.port)]
        command += ["--data-dir", str(self.data_dir), "--quiet"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=log)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the sandbox exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=0.5).json() == {"ok": True}:
                    self._client = httpx.Client(base_url=self.url, timeout=5.0)
                    return self
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the sandbox did not become healthy:\n{self.log_path.read_text()}")

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit code (0 for a clean stop)."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # --- admin endpoints --------------------------------------------------------------------

    @property
    def client(self) -> httpx.Client:
        assert self._client is not None, "the sandbox is not running"
        return self._client

    def reset(self) -> None:
        """Seed data again; empty the ledger, idempotency records and faults."""
        self.client.post("/reset").raise_for_status()

    def faults(self, **spec: Any) -> dict[str, Any]:
        """POST /faults (see sandbox/README.md); returns the settings now in force."""
        response = self.client.post("/faults", json=spec)
        assert response.status_code == 200, response.text
        return response.json()

    def clear_faults(self, system: str | None = None) -> None:
        params = {"system": system} if system else None
        self.client.delete("/faults", params=params).raise_for_status()

    def ledger(self, system: str | None = None) -> list[dict[str, Any]]:
        params = {"system": system} if system else None
        response = self.client.get("/ledger", params=params)
        assert response.status_code == 200, response.text
        return response.json()["effects"]

    def effects_for(self, request_id: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger() if e["request_id"] == request_id]

    # --- the systems' API, with their tokens ------------------------------------------------

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

    def order(self, order_id: str) -> dict[str, Any]:
        response = self.get("payments", f"/orders/{order_id}")
        assert response.status_code == 200, response.text
        return response.json()
