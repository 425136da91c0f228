"""Spark's face of episub: topics as a Structured Streaming source and sink.

    import spark_connector
    spark_connector.register(spark)
    rows = spark.readStream.format("episub").option("topic", "events").load()
    query = df.writeStream.format("episub").option("topic", "events").start()

    cfg = spark_connector.cluster_config(spark)  # live configuration: the driver writes,
    cfg.set("threshold", 0.7)                    # tasks read spark_connector.config.get(...)
    spark_connector.lag(query.lastProgress)      # rows a source query is behind

Nothing here is imported by `episub`; this package imports pyspark, from the `spark` extra.
"""

from episub.extras import MissingExtra, require

try:
    require("spark", "pyspark", "pyarrow")
except MissingExtra as missing:
    # One line naming the extra, not the bare "No module named 'pyspark'" of the first import.
    raise ModuleNotFoundError(f"spark_connector: {missing}", name="pyspark") from None

from spark_connector import config
from spark_connector.config import ClusterConfig, ConfigError, cluster_config
from spark_connector.datasource import SCHEMA, EpisubDataSource, register
from spark_connector.deployment import Deployment
from spark_connector.introspect import NodeView, overlay
from spark_connector.options import OptionError
from spark_connector.source import DataLossError, lag

__all__ = [
    "SCHEMA",
    "ClusterConfig",
    "ConfigError",
    "DataLossError",
    "Deployment",
    "EpisubDataSource",
    "NodeView",
    "OptionError",
    "cluster_config",
    "config",
    "lag",
    "overlay",
    "register",
]
