"""Spark session defaults for running pystreams apps on a laptop or a CI box.

Loopback networking and the current interpreter for Python workers are not optional here:
without them Spark's Python workers fail to connect back to the JVM on these machines.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

#: The RocksDB provider is what ``transformWithStateInPandas`` needs; it also keeps large
#: aggregation state off the JVM heap.
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

LOCAL_DEFAULTS: Mapping[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # A laptop has few cores; 200 shuffle partitions would mean 200 tiny tasks per batch.
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.session.timeZone": "UTC",
}


def prepare_environment() -> None:
    """Environment variables Spark reads when it launches the JVM and its Python workers."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def local_session(master: str = "local[2]", app_name: str = "pystreams", conf: Mapping[str, str] | None = None) -> Any:
    """A SparkSession with :data:`LOCAL_DEFAULTS` (``conf`` entries win); returns the session."""
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**LOCAL_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    jvm: Any = session.sparkContext._jvm
    for name in ORDINARY_WARNINGS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)
    return session


#: Loggers whose warnings are ordinary events for us: the state server warns on every read of
#: a key a ``MapState`` does not hold, which a store reads for each key it meets first.
ORDINARY_WARNINGS = ("org.apache.spark.sql.execution.python.streaming.TransformWithStateInPySparkStateServer",)


#: Where Spark logs a failed task and a failed query, each with full JVM and Python stacks. A
#: command that reports the failure itself in one line (``pystreams spark``) turns them off.
TASK_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.sql.execution.streaming",
)


def quiet_task_failures(session: Any) -> None:
    """Silence the loggers of :data:`TASK_FAILURE_LOGGERS` (the JVM's, and py4j's callback
    errors): the failure still reaches ``awaitTermination``, whose caller says it once."""
    import logging

    jvm = session.sparkContext._jvm
    level = jvm.org.apache.logging.log4j.Level.OFF
    for name in TASK_FAILURE_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)


def timed_local_session(master: str = "local[2]", app_name: str = "pystreams") -> tuple[Any, float]:
    """``local_session`` and how many seconds it took to start (for benchmarks)."""
    started = time.perf_counter()
    session = local_session(master, app_name)
    return session, time.perf_counter() - started
