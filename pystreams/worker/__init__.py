"""The worker's task-execution engine: runs tasks (sub-topology × partition) of a resolved
topology against Kafka with kafka-python, with state restored from changelogs. Group
membership lives in ``pystreams.client``; this package only executes what it is given."""

from .engine import EngineConfig, ErrorHandling, TaskEngine, resolve_against_cluster
from .errors import ErrorKind, ErrorPolicy, ProduceError, RecordFailure, RecordProcessingError
from .tasks import StreamTask

__all__ = [
    "EngineConfig",
    "ErrorHandling",
    "ErrorKind",
    "ErrorPolicy",
    "ProduceError",
    "RecordFailure",
    "RecordProcessingError",
    "StreamTask",
    "TaskEngine",
    "resolve_against_cluster",
]
