"""Not hypothesis: first on the PYTHONPATH of the tests' subprocesses (tests/conftest.py says
why), so that kio, which imports hypothesis when it can, goes without it there."""

raise ImportError("hypothesis is kept out of the tests' subprocesses (tests/conftest.py); "
                  "run this one with PYTHONPATH without tests/support/without_hypothesis")
