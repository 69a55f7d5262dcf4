"""The shared-memory algorithm's figures from collectives sweeps: ``shm`` against ``limit`` and MPI's own call.

    python -m experiments.bench.shm_targets results/bench_shm_p2.json [MORE.json ...] [--out FILE.json]

Reads sweeps of :mod:`experiments.bench.collectives` and prints, for each P, one line per figure of
:func:`plots.tables.shm_tables.figures` (each the median and range over the sweep's passes of a
ratio of two rows' times measured in the same pass) with its target and whether it is met
(:func:`plots.tables.shm_tables.verdict`).

Columns: figure, P, size, median, min, max (ratios), target, met; ``--out`` writes the figures as JSON.
"""
import json

from plots.tables.shm_tables import figures, size_text, verdict
from training.settings.options import Parser, infile, outpath

__all__ = ["main"]


def main(argv=None):
    """Print (and with ``--out`` write) the figures of the sweeps named on the command line."""
    p = Parser(prog="python -m experiments.bench.shm_targets", description=__doc__.split("\n")[0])
    p.add_argument("sweeps", type=infile(), nargs="+", help="JSON files of experiments.bench.collectives")
    p.add_argument("--out", type=outpath(empty=True), help="write the figures to this JSON file")
    a = p.parse_args(argv)
    rows = []
    for path in a.sweeps:
        with open(path, encoding="utf-8") as f:
            rows += json.load(f)["rows"]
    got = figures(rows)
    print(f"{'figure':<66} {'P':>2} {'size':>8} {'median':>7} {'min':>7} {'max':>7}  target  met")
    for f in got:
        lo = "-" if f["min"] is None else f"{f['min']:.2f}"
        hi = "-" if f["max"] is None else f"{f['max']:.2f}"
        target, met = verdict(f)
        print(f"{f['figure']:<66} {f['P']:>2} {size_text(f['bytes']):>8} {f['median']:>7.2f} {lo:>7} {hi:>7}  "
              f"{target:<7} {'yes' if met else 'no'}")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"sources": a.sweeps, "figures": got}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
