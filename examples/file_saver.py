"""A LangGraph checkpointer that survives the process: InMemorySaver, written to one file after
every write and read back at start.

The pinned langgraph ships no durable saver (langgraph-checkpoint-sqlite and -postgres are
separate packages, not installed here); in production use one of those. This one is enough for
an agent process that is killed and started again on the same machine.
"""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver


class FileSaver(InMemorySaver):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        self.lock = threading.Lock()
        if self.path.exists():
            # Only this saver writes the file, from what the graph's serializer produced.
            storage, writes, blobs = pickle.loads(self.path.read_bytes())
            for thread_id, namespaces in storage.items():
                for namespace, checkpoints in namespaces.items():
                    self.storage[thread_id][namespace].update(checkpoints)
            for key, value in writes.items():
                self.writes[key] = value
            self.blobs.update(blobs)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        saved = super().put(config, checkpoint, metadata, new_versions)
        self.flush()
        return saved

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        super().put_writes(config, writes, task_id, task_path)
        self.flush()

    def delete_thread(self, thread_id: str) -> None:
        super().delete_thread(thread_id)
        self.flush()

    def flush(self) -> None:
        """Write everything to a temporary file, fsync, and rename it over the old one: a
        process killed at any moment leaves the old state or the new, never half of one."""
        with self.lock:
            storage = {t: {ns: dict(c) for ns, c in n.items()} for t, n in self.storage.items()}
            body = pickle.dumps((storage, dict(self.writes), dict(self.blobs)))
            temporary = self.path.with_suffix(self.path.suffix + ".tmp")
            with temporary.open("wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
