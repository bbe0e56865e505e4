"""Run a pystreams app on Spark Structured Streaming.

``compile_topology`` checks that every node can run on Spark (no Spark needed);
``to_spark(app, spark, ...)`` builds the streaming query and returns a ``SparkJob`` (one query per sink).
"""

from .compiler import SparkCompileError, SparkJob, SparkPlan, compile_topology, to_spark

__all__ = ["SparkCompileError", "SparkJob", "SparkPlan", "compile_topology", "to_spark"]
