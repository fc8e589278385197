"""Fetch the next rows of a server-side cursor while the caller works on these.

The log checks (`runs/chain_check.py`, `runs/projections.py`) stream a million events
through a named cursor: alone, the process waits for each FETCH while the server reads the
rows, then the server waits while the process hashes or replays them. A thread that fetches
ahead lets the two overlap: psycopg waits for the server without holding the GIL, and loads
the rows (in C) between the caller's own work. At most `ahead` fetches wait, so memory stays
a few fetches' worth.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any


def prefetched(
    fetchmany: Callable[[int], list[Any]], size: int, ahead: int = 2
) -> Iterator[list[Any]]:
    """The cursor's rows, `size` at a time, until it has none. Close the iterator (or exhaust
    it) before closing the cursor: closing stops and joins the fetching thread. An error of
    the fetch is raised here, in the caller's thread. psycopg's connection lock orders the
    fetches with the caller's own queries on the same connection."""
    chunks: queue.Queue[list[Any] | BaseException] = queue.Queue(maxsize=ahead)
    stop = threading.Event()

    def fetch() -> None:
        try:
            while not stop.is_set():
                rows = fetchmany(size)
                chunks.put(rows)
                if not rows:
                    return
        except BaseException as exc:  # raised again in the caller's thread
            chunks.put(exc)

    fetcher = threading.Thread(target=fetch, name="prefetch", daemon=True)
    fetcher.start()
    try:
        while True:
            rows = chunks.get()
            if isinstance(rows, BaseException):
                raise rows
            if not rows:
                return
            yield rows
    finally:
        stop.set()
        while fetcher.is_alive():  # a fetcher waiting for room in the queue would never end
            with suppress(queue.Empty):
                chunks.get(timeout=0.1)
        fetcher.join()
