"""The agents `bin/demo --agent NAME` runs against the demo's console (`scripted` by default).

To add one: a line in AGENTS naming a class that takes `(base_url, api_key)` and is a thread
with `stop()`, and, when it needs a framework, the client package's extra of the same name
(bin/demo installs `./client[NAME]` for a name that is an extra). Modules are imported only
when chosen, so a framework that is not installed breaks nothing else.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from countersign import Countersign, CountersignError

log = logging.getLogger("countersign.demo_agent")


@dataclass(frozen=True)
class Choice:
    target: str  # "module:attribute"
    help: str


AGENTS: dict[str, Choice] = {
    "scripted": Choice(
        "examples.demo_agent:DemoAgent",
        "refunds and part replacements over the plain client (examples/demo_agent.py)",
    ),
    "langgraph": Choice(
        "examples.langgraph_refund:DemoRounds",
        "a LangChain agent with a scripted model (examples/langgraph_refund.py)",
    ),
}


def start(name: str, base_url: str, api_key: str) -> Any:
    module, attribute = AGENTS[name].target.split(":")
    agent = getattr(importlib.import_module(module), attribute)(base_url, api_key)
    agent.start()
    return agent


class Rounds(threading.Thread):
    """Runs `one_round(client, number)` again and again, a pause between rounds, until
    stopped: what an example needs to be a demo agent."""

    one_round: Callable[[Countersign, int], None]

    def __init__(self, base_url: str, api_key: str, interval: float = 8.0) -> None:
        super().__init__(name="demo-agent", daemon=True)
        self.client = Countersign(base_url, api_key)
        self.interval = interval
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        number = 0
        while not self.stopping.wait(self.interval if number else 1.0):
            number += 1
            try:
                self.one_round(self.client, number)
            except (CountersignError, OSError) as exc:
                # Keep going: the demo shows the next round, and the error is in the log.
                log.warning("demo agent: %s", exc)
        self.client.close()
