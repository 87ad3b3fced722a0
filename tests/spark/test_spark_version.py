"""Which pyspark format("oncelog") runs on, and what a user of another one is told."""

from __future__ import annotations

import subprocess
import sys

import pytest

from oncelog.spark.version import problem


@pytest.mark.parametrize("version", ["4.2.0", "4.2.1", "4.3.0", "4.2.0.dev1"])
def test_supported_versions(version):
    assert problem(version) is None


@pytest.mark.parametrize("version", ["4.0.0", "4.1.4", "3.5.1", "5.0.0"])
def test_other_versions_are_told_what_is_needed(version):
    assert problem(version) == (
        'format("oncelog") needs pyspark >=4.2,<5 (streaming reads use the Python streaming '
        f"source API of pyspark 4.2: pyspark.sql.streaming.datasource); this is pyspark "
        f"{version}. Install a supported one: pip install 'pyspark>=4.2,<5'")


OLD_PYSPARK = """
import pyspark
pyspark.__version__ = "4.1.0"  # what an older install reports
try:
    import oncelog.spark
except ImportError as exc:
    print("import:", exc)
import pyspark_oncelog
source = pyspark_oncelog.DefaultSource({"subscribe": "t"})
print("name:", source.name())
for use in (lambda: source.schema(), lambda: source.reader(None),
            lambda: source.streamWriter(None, False)):
    try:
        use()
    except ImportError as exc:
        print("use:", exc)
from oncelog.cli.main import main
print("audit --spark exits", main(["audit", "--topic", "t", "--spark"]))
"""


def test_an_older_pyspark_gets_the_reason_not_a_missing_name():
    """Spark imports pyspark_oncelog to find Python data sources: it must still import, and
    format("oncelog") then says what it needs; so do `import oncelog.spark` and
    `oncelog audit --spark`."""
    run = subprocess.run([sys.executable, "-c", OLD_PYSPARK], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    reason = problem("4.1.0")
    assert run.stdout.splitlines() == [f"import: {reason}", "name: oncelog",
                                       *[f"use: {reason}"] * 3, "audit --spark exits 2"]
    assert f"oncelog audit --spark: {reason}" in run.stderr
