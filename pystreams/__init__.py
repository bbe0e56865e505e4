"""pystreams: Kafka Streams-style stream processing on the KIP-848 rebalance protocol."""

from pystreams import serdes
from pystreams.app import (
    App,
    Branches,
    HoppingWindow,
    JoinWindow,
    Processor,
    ProcessorContext,
    PunctuationType,
    SessionWindow,
    Stream,
    Table,
    TumblingWindow,
    Windowed,
    kv_store,
    load_app,
    punctuate,
    session_store,
    until_time_limit,
    until_window_closes,
    window_store,
)
from pystreams.topology.errors import TopologyError

__all__ = [
    "App",
    "Branches",
    "HoppingWindow",
    "JoinWindow",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "SessionWindow",
    "Stream",
    "Table",
    "TopologyError",
    "TumblingWindow",
    "Windowed",
    "kv_store",
    "load_app",
    "punctuate",
    "serdes",
    "session_store",
    "until_time_limit",
    "until_window_closes",
    "window_store",
]
