"""Countersign's Python client: what an agent imports to hand its side effects over.

    from countersign import Countersign
    cs = Countersign("http://127.0.0.1:8000", api_key)

It depends on httpx only.
"""

from countersign.client import Countersign, CountersignError, is_settled

__all__ = ["Countersign", "CountersignError", "is_settled"]
