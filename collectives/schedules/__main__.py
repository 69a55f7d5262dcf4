"""``python -m collectives.schedules FILE.py:FUNCTION``: verify a schedule builder from the command line.

It loads the builder (:func:`collectives.schedules.registry.import_builder`) and runs
:func:`collectives.schedules.verify.verify` on it for every P up to ``--max-size``.
"""
import argparse
import sys

from collectives.errors import ScheduleViolation
from collectives.schedules.registry import import_builder
from collectives.schedules.verify import COLLECTIVE_ARGUMENTS, verify


def main(argv=None):
    """Verify the builder named on the command line; print what was checked, or the violation and exit 1.

    ``python -m collectives.schedules FILE.py:FUNCTION [--collective allreduce] [--max-size 64]``
    """
    p = argparse.ArgumentParser(prog="python -m collectives.schedules",
                                description="Check a schedule builder symbolically for every P up to --max-size "
                                            "and counts 0, P - 1 and 2P + 1 (collectives.schedules.verify).")
    p.add_argument("builder", help="FILE.py:FUNCTION or package.module:FUNCTION")
    p.add_argument("--collective", default="allreduce", choices=list(COLLECTIVE_ARGUMENTS),
                   help="the collective it computes (default allreduce)")
    p.add_argument("--max-size", type=int, default=64, help="largest P checked (default 64)")
    a = p.parse_args(argv)
    if a.max_size < 1:
        p.error(f"--max-size must be >= 1, got {a.max_size}")
    try:
        builder = import_builder(a.builder)
    except ValueError as exc:
        p.error(str(exc))
    try:
        out = verify(builder, a.collective, sizes=range(1, a.max_size + 1))
    except ScheduleViolation as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print(f"verified {a.builder} as {a.collective}: {out['cases']} cases (P = 1..{a.max_size}, counts 0, P - 1, "
          f"2P + 1) in {out['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
