"""``import oncelog`` imports no client: every broker, command-line tool and Spark Python
worker pays for it, and most need one client or none (issue 26: ``import oncelog`` was about
0.65 s). The public names still come from ``oncelog``, each on first use."""

from __future__ import annotations

import json
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
