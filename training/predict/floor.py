"""A round's least duration on a host, per ranks per core, fitted from all-reduce sweeps.

    python -m training.predict.floor [--sweeps DIR] [--gamma S_PER_BYTE]

On a host whose ranks outnumber its cores, a rank's round of a collective (post its send and
receive, wait, copy, reduce) ends only once the rank has had a core again; a round of a few kilobytes
then lasts far longer than its latency and bytes. The predictor models it as a floor
(:func:`training.predict.message_times.floored`): a collective of R rounds lasts at least ``R f``, and
``f`` depends on the ranks per core ``o`` (:attr:`collectives.model.network.Network.oversubscription`).

Fit: the three-level study's sweeps (:mod:`experiments.cluster.levels`: ``bench_collectives``
all-reduce sweeps from 64 KiB, one node at P = 2 and 4, emulated 1 x 2 x 2 and 2 x 2 x 1 at P = 4,
emulated 2 x 2 x 2 at P = 8, on a host of ``cores`` cores, at 1 Gbit/s and 100 Mbit/s) are grouped by
their ``o = P / cores``. Every point is replayed with the calibrated network of its rate
(``calib_RATE.json``: every level's ping-pong latency and bandwidth, no fit) and its schedule's
rounds; ``f(o)`` is the value on a log grid (0.1 us to 100 ms) that minimizes the mean squared log
error of ``max(replayed, R f)`` against the measured medians of the sweeps at that ``o``. Between
the fitted ``o``, :func:`round_s` interpolates linearly; outside, it keeps the nearest one.
Points whose replay is already longer than ``R f`` do not move the fit: it says only how long a round
lasts at least.
"""
import json
import math
import os
import sys

import numpy

from training.predict import message_times
from training.predict import topology as topomod
from training.settings.options import Parser, real, text

__all__ = ["SWEEPS", "DEFAULT_DIR", "points", "fit", "floors", "round_s", "main"]

#: The three-level study's published sweeps and calibrations (relative to the repository).
DEFAULT_DIR = os.path.join("plots", "reference", "cluster", "levels_sweeps")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Sweep file stems (``{rate}`` filled in) and their layouts (racks, nodes per rack, ranks per node).
SWEEPS = (("shm_2", (1, 1, 2)), ("shm_4", (1, 1, 4)), ("fit_1x2x2_{rate}", (1, 2, 2)),
          ("fit_2x2x1_{rate}", (2, 2, 1)), ("target_2x2x2_{rate}", (2, 2, 2)))
RATES = ("1gbit", "100mbit")
_ALGORITHMS = ("ring", "rabenseifner", "2d", "torus", "tree", "recursive_doubling")
_GRID = numpy.geomspace(1e-7, 0.1, 701)


def _cores(sweep):
    return int((sweep.get("provenance") or {}).get("cores") or sweep.get("cpus") or 0)


def points(sweep, cal, layout, gamma):
    """Return ``(o, [(measured_s, replayed_s, rounds)])`` for one sweep replayed on its calibration.

    Parameters
    ----------
    sweep : dict
        A ``bench_collectives`` result (``rows`` with ``algorithm``, ``bytes``, ``time_median_us``).
    cal : dict
        The emulator's ``--calibrate`` result for the sweep's rate.
    layout : tuple of int
        (racks, nodes per rack, ranks per node).
    gamma : float
        Reduction seconds per byte (one core, unshared).
    """
    cores = _cores(sweep)
    doc = topomod.from_calibration(cal, *layout, cores=cores)
    net = topomod.parse(doc).with_gamma(gamma)
    out = []
    for r in sweep["rows"]:
        if r.get("collective", "allreduce") != "allreduce" or r["algorithm"] not in _ALGORITHMS or r["time_median_us"] <= 0:
            continue
        grid = "topology" if r["algorithm"] in ("2d", "torus") else None
        rep = float(message_times.allreduce_clocks(r["algorithm"], r["bytes"], net, grid).max())
        rounds = message_times.allreduce_rounds(r["algorithm"], net.size, r["bytes"], grid, 4, net)
        out.append((r["time_median_us"] * 1e-6, rep, rounds))
    return net.oversubscription, out


def fit(pts):
    """Return the floor ``f`` (seconds) minimizing the mean squared log error of ``max(rep, R f)``.

    Examples
    --------
    >>> pts = [(4e-3, 1e-3, 10), (2e-3, 0.5e-3, 5), (9e-3, 9e-3, 4)]  # the first two need 0.4 ms a round
    >>> round(fit(pts) * 1e6, -1)  # microseconds, to the grid's 2 % steps
    400.0
    """
    m = numpy.array([p[0] for p in pts])
    rep = numpy.array([p[1] for p in pts])
    rounds = numpy.array([p[2] for p in pts], float)
    err = numpy.log(numpy.maximum(rep[None, :], _GRID[:, None] * rounds[None, :]) / m[None, :])
    cost = numpy.mean(err * err, axis=1)
    return float(_GRID[int(numpy.argmin(cost + 1e-12 * numpy.arange(len(_GRID))))])  # ties: the smallest


def floors(sweep_dir=DEFAULT_DIR, gamma=1 / 4e9):
    """Return ``{o: f}`` (ranks per core -> seconds) fitted on the sweeps under ``sweep_dir``.

    Raises
    ------
    ValueError
        No sweep found there.

    Examples
    --------
    >>> table = floors()  # the published sweeps: 2-core host, P = 2, 4 and 8
    >>> sorted(table), table[1.0] < table[4.0]
    ([1.0, 2.0, 4.0], True)
    """
    if not os.path.isdir(sweep_dir) and not os.path.isabs(sweep_dir):  # from another directory: the repository's
        sweep_dir = os.path.join(_ROOT, sweep_dir) if os.path.isdir(os.path.join(_ROOT, sweep_dir)) else sweep_dir
    by = {}
    for rate in RATES:
        cal_path = os.path.join(sweep_dir, f"calib_{rate}.json")
        if not os.path.exists(cal_path):
            continue
        with open(cal_path, encoding="utf-8") as f:
            cal = json.load(f)
        for stem, layout in SWEEPS:
            path = os.path.join(sweep_dir, stem.format(rate=rate) + ".json")
            if "{rate}" not in stem and rate != RATES[0] or not os.path.exists(path):
                continue  # a one-node sweep has no rate: read it once
            with open(path, encoding="utf-8") as f:
                o, pts = points(json.load(f), cal, layout, gamma)
            by.setdefault(o, []).extend(pts)
    if not by:
        raise ValueError(f"{sweep_dir}: no all-reduce sweeps (calib_RATE.json and {SWEEPS[0][0]}.json ...)")
    return {o: fit(pts) for o, pts in sorted(by.items())}


def round_s(table, o):
    """The floor at ``o`` ranks per core from ``table`` (``{o: f}``): linear between, nearest outside.

    Examples
    --------
    >>> round_s({1.0: 40e-6, 2.0: 60e-6, 4.0: 360e-6}, 3.0) * 1e6
    210.0
    """
    xs = sorted(table)
    return float(numpy.interp(o, xs, [table[x] for x in xs]))


def main(argv=None):
    p = Parser(prog="python -m training.predict.floor", description=__doc__.split("\n")[0])
    p.add_argument("--sweeps", type=text(), default=DEFAULT_DIR, help=f"directory of the sweeps (default {DEFAULT_DIR})")
    p.add_argument("--gamma", type=real(0, 1e15, low_open=True), default=1 / 4e9, help="reduction seconds per byte (default 1/4e9)")
    a = p.parse_args(argv)
    try:
        table = floors(a.sweeps, a.gamma)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for o, f in table.items():
        print(f"ranks per core {o:g}: a round lasts at least {f * 1e6:.0f} us (log10 {math.log10(f):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
