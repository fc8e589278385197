"""In-memory fault injection settings for the sandbox systems.

Faults are deliberately not persisted: a restart of the sandbox starts with a healthy system,
which is what a demo or a test expects after it has set up its own faults.

Model: per system, a map from fault name to a rule (probability, optional parameter, optional
remaining count). Setting a fault again replaces its rule; probability 0 removes it. A rule
with ``remaining`` counts down on every write request of its system and disappears at zero.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import dataclass, field
from typing import Any

SYSTEMS = ("payments", "warehouse", "carrier", "mailer")

# Faults that act before anything is committed, checked in this order; the first that fires wins.
PRE_COMMIT_FAULTS = ("drop_request_before_commit", "http_401", "http_429", "http_5xx")
# Faults that act after the effect is committed.
POST_COMMIT_FAULTS = ("drop_response_after_commit", "delay_response")
WRITE_FAULTS = PRE_COMMIT_FAULTS + POST_COMMIT_FAULTS

# Fault name -> (parameter name, default value) for faults that take a parameter.
FAULT_PARAMETERS = {"delay_response": ("delay_seconds", 10.0), "http_429": ("retry_after", 1.0)}

SETTING_KEYS = {
    "system",
    "times",
    "lookup_lag_seconds",
    *WRITE_FAULTS,
    *(name for name, _ in FAULT_PARAMETERS.values()),
}


class FaultSpecError(ValueError):
    """The POST /faults body is not a valid fault specification."""


@dataclass
class FaultRule:
    probability: float
    parameter: float | None = None
    remaining: int | None = None

    def view(self, name: str) -> dict[str, Any]:
        view: dict[str, Any] = {"probability": self.probability, "remaining": self.remaining}
        if name in FAULT_PARAMETERS:
            view[FAULT_PARAMETERS[name][0]] = self.parameter
        return view


@dataclass
class SystemFaults:
    rules: dict[str, FaultRule] = field(default_factory=dict)
    lookup_lag_seconds: float = 0.0


@dataclass(frozen=True)
class FaultDecision:
    """What to do to one write request; rolled once when the request arrives."""

    pre_commit: str | None = None  # one of PRE_COMMIT_FAULTS, or None to process normally
    retry_after_seconds: int = 1
    drop_response: bool = False
    delay_seconds: float = 0.0

    @property
    def label(self) -> str:
        """Short description for the request log line; empty when nothing fired."""
        parts = [self.pre_commit] if self.pre_commit else []
        if self.drop_response:
            parts.append("drop_response_after_commit")
        if self.delay_seconds:
            parts.append(f"delay_response={self.delay_seconds:g}s")
        return ",".join(parts)


NO_FAULT = FaultDecision()


def _number(spec: dict[str, Any], key: str, *, upper: float | None = None) -> float | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FaultSpecError(f"{key} must be a number")
    if value < 0 or (upper is not None and value > upper):
        raise FaultSpecError(f"{key} must be between 0 and {upper if upper else 'infinity'}")
    return float(value)


class FaultBoard:
    """Thread-safe fault settings for all systems."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._lock = threading.Lock()
        self._rng = rng or random.Random()
        self._systems = {system: SystemFaults() for system in SYSTEMS}

    def configure(self, spec: dict[str, Any]) -> None:
        """Apply one POST /faults body; validates everything before changing anything."""
        unknown = sorted(set(spec) - SETTING_KEYS)
        if unknown:
            raise FaultSpecError(f"unknown setting(s): {', '.join(unknown)}")
        system = spec.get("system")
        if system != "*" and system not in SYSTEMS:
            raise FaultSpecError(f"system must be one of {', '.join(SYSTEMS)} or *")
        times = spec.get("times")
        if times is not None and (
            isinstance(times, bool) or not isinstance(times, int) or times < 1
        ):
            raise FaultSpecError("times must be a positive integer")
        rules: dict[str, FaultRule | None] = {}
        for name in WRITE_FAULTS:
            probability = _number(spec, name, upper=1.0)
            if probability is None:
                continue
            parameter = None
            if name in FAULT_PARAMETERS:
                parameter_name, default = FAULT_PARAMETERS[name]
                given = _number(spec, parameter_name)
                parameter = default if given is None else given
            rules[name] = FaultRule(probability, parameter, times) if probability > 0 else None
        for fault, (parameter_name, _) in FAULT_PARAMETERS.items():
            if parameter_name in spec and fault not in rules:
                raise FaultSpecError(f"{parameter_name} needs {fault} in the same request")
        if times is not None and not rules:
            raise FaultSpecError("times needs at least one write fault in the same request")
        lag = _number(spec, "lookup_lag_seconds")

        targets = SYSTEMS if system == "*" else (system,)
        with self._lock:
            for target in targets:
                state = self._systems[target]
                for name, rule in rules.items():
                    if rule is None:
                        state.rules.pop(name, None)
                    else:
                        # A copy per system: each system counts its own remaining requests.
                        state.rules[name] = FaultRule(
                            rule.probability, rule.parameter, rule.remaining
                        )
                if lag is not None:
                    state.lookup_lag_seconds = lag

    def clear(self, system: str | None = None) -> None:
        if system is not None and system not in SYSTEMS:
            raise FaultSpecError(f"system must be one of {', '.join(SYSTEMS)}")
        with self._lock:
            for target in SYSTEMS if system is None else (system,):
                self._systems[target] = SystemFaults()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                system: {
                    "lookup_lag_seconds": state.lookup_lag_seconds,
                    "faults": {name: rule.view(name) for name, rule in state.rules.items()},
                }
                for system, state in self._systems.items()
            }

    def lookup_lag(self, system: str) -> float:
        with self._lock:
            return self._systems[system].lookup_lag_seconds

    def decide(self, system: str) -> FaultDecision:
        """Roll the dice for one write request of ``system`` and count down limited rules."""
        with self._lock:
            rules = self._systems[system].rules
            if not rules:
                return NO_FAULT
            fired = {name for name, rule in rules.items() if self._rng.random() < rule.probability}
            pre_commit = next((name for name in PRE_COMMIT_FAULTS if name in fired), None)
            retry_after = rules["http_429"].parameter if "http_429" in rules else None
            delay = rules["delay_response"].parameter if "delay_response" in fired else None
            for name in list(rules):
                rule = rules[name]
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        del rules[name]
        if pre_commit is not None:
            # A request refused before processing gets no post-commit fault: nothing committed.
            return FaultDecision(pre_commit, math.ceil(retry_after or 0))
        return FaultDecision(
            drop_response="drop_response_after_commit" in fired,
            delay_seconds=delay or 0.0,
        )
