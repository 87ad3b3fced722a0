"""``import oncelog`` imports no client: every broker, command-line tool and Spark Python
worker pays for it, and most need one client or none (issue 26: ``import oncelog`` was about
0.65 s). The public names still come from ``oncelog``, each on first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import oncelog


def test_import_oncelog_imports_no_client_and_no_kio():
    loaded = subprocess.run(
        [sys.executable, "-c", "import json, sys, oncelog; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, timeout=60, check=True).stdout
    heavy = [name for name in json.loads(loaded)
             if name.startswith(("oncelog.", "kio", "hypothesis"))]
    assert heavy == []


def test_every_public_name_comes_from_oncelog():
    namespace: dict[str, object] = {}
    exec("from oncelog import *", namespace)  # the star import itself is what is tested
    assert sorted(name for name in namespace if not name.startswith("__")) == \
        sorted(oncelog.__all__)
    for name in oncelog.__all__:
        value = getattr(oncelog, name)
        assert value.__name__ == name and value.__module__.startswith("oncelog.client."), name
    assert set(oncelog.__all__) <= set(dir(oncelog))


def _imports_in_fresh_process(code: str) -> dict:
    """What ``code`` leaves imported, in a fresh interpreter where hypothesis can be imported
    (the tests' subprocesses get a PYTHONPATH on which it cannot: tests/conftest.py)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                          "import kio.static._phantom as p\n"
                          "print(json.dumps({'modules': sorted(sys.modules),"
                          " 'kio_sees_hypothesis': p.hypothesis is not None}))"],
                         capture_output=True, text=True, timeout=60, check=True, env=env)
    return json.loads(out.stdout)


def test_a_client_does_not_import_hypothesis_through_kio():
    # kio imports hypothesis whenever it can, to register strategies for its types: about
    # half of what importing a client cost (issue 26). A producer or Spark worker has no use
    # for them.
    seen = _imports_in_fresh_process("from oncelog import Producer, Consumer, Admin")
    assert "kio.static._phantom" in seen["modules"]
    assert not [name for name in seen["modules"] if name.startswith("hypothesis")]
    assert not seen["kio_sees_hypothesis"]
    # hypothesis itself still imports afterwards
    assert "hypothesis.strategies" in _imports_in_fresh_process(
        "from oncelog import Producer\nimport hypothesis.strategies")["modules"]


def test_kio_keeps_its_strategies_when_hypothesis_came_first():
    seen = _imports_in_fresh_process("import hypothesis\nfrom oncelog import Producer")
    assert seen["kio_sees_hypothesis"]
