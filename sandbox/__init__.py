"""Countersign sandbox: simulated external systems (payments, warehouse, carrier, mailer).

Real HTTP servers with persistent state and fault injection, used by the demo and the tests.
Standard library only; it must not import Django. See README.md in this folder for the API.
"""

from .server import SandboxServer, make_server, serve
from .systems import TOKENS

__all__ = ["TOKENS", "SandboxServer", "make_server", "serve"]
