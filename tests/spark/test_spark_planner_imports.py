"""Spark runs a data source's driver-side steps (lookup, create and its schema, write, commit,
a stream's commit) each in a Python planner process of its own, and one more set of them for
every streaming query: what they import is paid again in each. They need neither pyarrow nor
numpy (0.2-0.3 s of CPU to import); only the tasks, which build and take Arrow batches, do."""

import subprocess
import sys

CHECK = """
import sys
import pyspark.sql.worker.commit_data_source_write, pyspark.sql.worker.write_into_data_source
import oncelog.spark, oncelog.spark.source, oncelog.spark.sink, oncelog.spark.two_phase
print(sorted(m for m in ("pyarrow", "numpy", "pandas") if m in sys.modules))
"""


def test_the_planners_import_neither_pyarrow_nor_numpy():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "[]", out.stdout
