"""A Spark Connect server and client of their own, for tests/spark/test_spark_connect.py, run as a
subprocess (one SparkContext per process: the shared classic session lives in the test's).

    spark_connect_job.py BOOTSTRAP SOURCE TOPIC

Starts a Spark Connect server (Spark's SparkConnectPlugin in a local[2] SparkContext, gRPC
bound to 127.0.0.1 on a free port), then, as a client of it over sc://, reads SOURCE with
format("oncelog") and writes its values upper-cased to TOPIC with format("oncelog"). Prints
one JSON line: the client's session class and the values read.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import sparks  # its neighbour in tests/support/ (Python puts a script's folder on sys.path)


def main() -> None:
    bootstrap, source, topic = sys.argv[1:4]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.update(sparks.JAVA_ENV)  # C1 only and one GC thread, as every test JVM
    os.environ["PYTHONPATH"] = sparks.worker_path()  # the JVM's, which its workers inherit
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from pyspark import SparkConf, SparkContext

    conf = (SparkConf().setMaster("local[2]").setAppName("oncelog-connect")
            .set("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
            .set("spark.connect.grpc.binding.address", "127.0.0.1")
            .set("spark.connect.grpc.binding.port", str(port))
            .set("spark.ui.enabled", "false").set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.sql.shuffle.partitions", "2")
            .setAll(sparks.worker_config().items()))
    context = SparkContext(conf=conf)
    context.setLogLevel("ERROR")
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    spark = RemoteSparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
    try:
        df = (spark.read.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).load())
        values = sorted(r.value.decode() for r in df.select("value").collect())
        (df.selectExpr("key", "upper(cast(value as string)) as value")
           .write.format("oncelog").mode("append")
           .option("kafka.bootstrap.servers", bootstrap).option("topic", topic).save())
        print(json.dumps({"session": type(spark).__module__, "values": values}), flush=True)
    finally:
        spark.stop()
        context.stop()


if __name__ == "__main__":
    main()
