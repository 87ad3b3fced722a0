# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
SPARK_STAMP := $(VENV)/.installed-spark
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ARGS ?=

.PHONY: run cluster test lint bench demo system-deps clean

# The compiled parts are rebuilt by the install when their sources change.
$(STAMP): pyproject.toml setup.py src/oncelog/protocol/_records.c \
		src/oncelog/protocol/record_builder.h src/oncelog/client/producer/_append.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[fast]'
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[fast,test]'
	touch $@

$(SPARK_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[fast,spark]'
	touch $@

run: $(STAMP)
	$(PY) -m oncelog broker --set log.dirs=./data $(ARGS)

# Cluster mode to try: ZooKeeper and three brokers on loopback, data under ./data/cluster.
cluster: $(STAMP) system-deps
	$(PY) -m pip install --quiet -e '.[fast,cluster]'
	$(PY) -m oncelog cluster up --brokers 3 $(ARGS)

# kcat (a real Kafka client binary), a Java runtime (for PySpark), ZooKeeper (the cluster
# tests' coordinator, run from its jar by tests/support/zookeepers.py) and iproute2 (the network
# namespaces of tests/support/netns.py) come from Debian.
system-deps:
	@missing=""; \
	command -v kcat >/dev/null 2>&1 || missing="$$missing kcat"; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	[ -f /usr/share/java/zookeeper.jar ] || missing="$$missing zookeeper"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		$(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq $$missing; \
	fi

# The tests' temporary directories, every broker's log.dirs among them, go to /dev/shm when it
# has SHM_MIN_KB free and is not noexec: a broker fsyncs what it acknowledges, and on a shared
# virtual disk each fsync took milliseconds (test_descriptors: 35 s on disk, 12 s on tmpfs).
# A kill -9 keeps the page cache either way, so the crash tests test the same; the faults of
# power cuts, failed fsyncs and full disks are the tests' own (fault injection, their own small
# tmpfs). Only the failed tests' directories are kept there (they live in memory).
SHM_MIN_KB := 4000000
# Four workers on two cores: most of the suite waits (brokers starting, timeouts it lets run
# out, kills and elections), and two workers left the cores idle more than half the run.
# --dist loadgroup selects tests/conftest.py's scheduler: each test a unit of its own, handed
# out in that file's order as a worker runs low, the Spark tests to two workers only (each
# worker that runs them starts a Spark JVM); --dist load would send each worker a first chunk
# of a quarter of its share.
test: $(TEST_STAMP) system-deps
	$(PY) -m ruff check src tests bench examples
	@if [ "$$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $$4}')" -ge $(SHM_MIN_KB) ] \
			2>/dev/null && ! awk '$$2 == "/dev/shm" && $$4 ~ /noexec/ {f = 1} END {exit !f}' \
			/proc/mounts; then \
		echo "the tests' temporary files (the brokers' log.dirs) on tmpfs: TMPDIR=/dev/shm"; \
		export TMPDIR=/dev/shm; keep="-o tmp_path_retention_policy=failed"; \
	fi; \
	set -x; $(PY) -m pytest -n 4 --dist loadgroup --durations=30 $$keep $(ARGS)

lint: $(TEST_STAMP)
	$(PY) -m ruff check src tests bench examples

# The example pipeline (examples/pipeline.py) on Spark local[*], with its own broker.
demo: $(SPARK_STAMP) system-deps
	$(PY) examples/pipeline.py $(ARGS)

bench: $(TEST_STAMP)
	$(PY) bench/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/oncelog/protocol/*.so src/oncelog/client/producer/*.so
