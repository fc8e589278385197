"""The error names of run memory: checkpoints, feedback and eval traces. Raised as
`runs.errors.DomainError(NAME, message)`; the API answers the name and the status."""

from __future__ import annotations

# Checkpoints (memory/checkpoints.py, memory/schemas.py).
CHECKPOINT_TOO_LARGE = "checkpoint.too_large"  # 413: over CHECKPOINT_MAX_BYTES
CHECKPOINT_CHAIN_OF_THOUGHT = "checkpoint.chain_of_thought_refused"  # 422: not persisted
CHECKPOINT_FOREIGN_REFERENCE = "checkpoint.foreign_reference"  # 422: an id not of this run
CHECKPOINT_NO_MIGRATION_PATH = "checkpoint.no_migration_path"  # 409: no registered way there

# Feedback facts (memory/feedback.py).
FEEDBACK_EMPTY = "feedback.empty"  # 422: neither a rating nor a label
FEEDBACK_SUBJECT_NOT_IN_RUN = "feedback.subject_not_in_run"  # 422: about another run's object

# Eval traces (memory/eval_trace.py).
EVAL_FORBIDDEN = "eval.forbidden"  # 403: the key lacks eval:read
