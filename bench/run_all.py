"""Run every benchmark module in bench/ and print their results: ``make bench [ARGS=...]``.

A benchmark module is any ``bench/*.py`` except this file and names starting with ``_``
(helpers). Each runs in its own interpreter, one after the other; its output goes straight to
the terminal. Arguments for the modules:

* ``MODULE:ARG`` goes to that module only:
  ``make bench ARGS="produce_consume:--messages=50000 producer_state:--producers=1000"``;
* any other argument goes to every module that runs, so use it with ``--only``:
  ``make bench ARGS="--only produce_consume --messages 50000 --profile /tmp/prof"``.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MODULE_TIMEOUT = 1800.0  # seconds; a benchmark that takes longer is stuck


def modules() -> list[Path]:
    return sorted(p for p in BENCH_DIR.glob("*.py")
                  if p.name != Path(__file__).name and not p.name.startswith("_"))


def run_module(path: Path, args: list[str]) -> int | str:
    proc = subprocess.Popen([sys.executable, str(path), *args], cwd=BENCH_DIR.parent)
    try:
        return proc.wait(MODULE_TIMEOUT)
    except subprocess.TimeoutExpired:
        # SIGINT first: the module's context managers then stop the brokers it started.
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(60)
        return "timeout"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="MODULE:ARG passes ARG to MODULE only; any other argument goes to every module "
               "that runs.")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this module (e.g. produce_consume); repeatable")
    parser.add_argument("--list", action="store_true", help="list the modules and exit")
    args, rest = parser.parse_known_args(argv)
    found = modules()
    if args.list:
        for path in found:
            print(path.stem)
        return 0
    if args.only:
        unknown = set(args.only) - {p.stem for p in found}
        if unknown:
            parser.error(f"no such benchmark module: {', '.join(sorted(unknown))}")
        found = [p for p in found if p.stem in args.only]
    names = {p.stem for p in modules()}
    common = [arg for arg in rest if arg.partition(":")[0] not in names]
    failed = []
    for path in found:
        own = [arg.partition(":")[2] for arg in rest if arg.partition(":")[0] == path.stem]
        module_args = common + own
        print(f"=== {path.stem} {' '.join(module_args)}".rstrip(), flush=True)
        started = time.monotonic()
        code = run_module(path, module_args)
        print(f"=== {path.stem}: {'ok' if code == 0 else f'FAILED ({code})'} "
              f"in {time.monotonic() - started:.0f} s\n", flush=True)
        if code != 0:
            failed.append(path.stem)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
