"""The sandbox (simulated external systems) as a real process, for tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ROOT, free_port, wait_for


class Sandbox:
    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> Sandbox:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sandbox",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                "--quiet",
            ],
            cwd=ROOT,
        )

        def healthy() -> bool:
            try:
                return httpx.get(f"{self.url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 15, "the sandbox")
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def reset(self) -> None:
        httpx.post(f"{self.url}/reset", timeout=5).raise_for_status()

    def faults(self, **faults: Any) -> None:
        httpx.post(f"{self.url}/faults", json=faults, timeout=5).raise_for_status()

    def clear_faults(self) -> None:
        httpx.delete(f"{self.url}/faults", timeout=5).raise_for_status()

    def ledger(self, system: str | None = None) -> list[dict[str, Any]]:
        params = {"system": system} if system else None
        return httpx.get(f"{self.url}/ledger", params=params, timeout=5).json()["effects"]

    def effects_for(self, request_id: str) -> list[dict[str, Any]]:
        return [e for e in self.ledger() if e["request_id"] == request_id]

    def get(self, path: str) -> dict[str, Any]:
        return httpx.get(f"{self.url}{path}", timeout=5).json()
