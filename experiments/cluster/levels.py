"""The three-level study: fit the shared-link network model on small emulated layouts and predict a
larger one it never saw, beside that layout's measured all-reduce sweeps.

Measure (each ``bench_collectives`` sweep under :mod:`training.emulator.emulate` on a quiet
machine; RATE is ``1gbit`` or ``100mbit``, the node links and the uplinks alike; ``--settle 120`` lets
the sweep wait for its own ranks' start-up to leave the load average)::

    B="python -m experiments.bench.collectives --ops allreduce --min-bytes 64K --iters 3 --warmup 1 \
       --max-time 3 --repeats 3 --settle 120"
    mpiexec -n 2 $B --max-bytes 16M --algorithms ring,rabenseifner --out results/cluster3/shm_2
    mpiexec -n 4 $B --max-bytes 16M --algorithms ring,rabenseifner --out results/cluster3/shm_4
    python -m training.emulator.emulate --racks 2 --nodes 2 --ranks-per-node 2 --link RATE --uplink RATE \
        --calibrate --out results/cluster3/calib_RATE.json
    python -m training.emulator.emulate --racks 1 --nodes 2 --ranks-per-node 2 --link RATE -- \
        $B --max-bytes 16M --algorithms ring,rabenseifner,2d --out results/cluster3/fit_1x2x2_RATE
    python -m training.emulator.emulate --racks 2 --nodes 2 --ranks-per-node 1 --link RATE --uplink RATE -- \
        $B --max-bytes 16M --algorithms ring,rabenseifner,torus --out results/cluster3/fit_2x2x1_RATE
    python -m training.emulator.emulate --racks 2 --nodes 2 --ranks-per-node 2 --link RATE --uplink RATE -- \
        $B --max-bytes 64M --algorithms ring,2d,torus,rabenseifner,mpi --out results/cluster3/target_2x2x2_RATE

(at 100 Mbit/s the target sweep stops at ``--max-bytes 4M``: one pass to 64 MiB takes about 13 minutes
there, Rabenseifner's calls most of it), then fit and predict (one process, no MPI launch)::

    python -m experiments.cluster.levels --intra results/cluster3/shm_2.json --intra results/cluster3/shm_4.json \\
        --calibration 1gbit=results/cluster3/calib_1gbit.json \\
        --fit 1gbit/1x2x2=results/cluster3/fit_1x2x2_1gbit.json --fit 1gbit/2x2x1=results/cluster3/fit_2x2x1_1gbit.json \\
        --predict 1gbit/2x2x2=results/cluster3/target_2x2x2_1gbit.json \\
        (the same three with 100mbit) --out results/cluster3/levels
    python -m plots.levels results/cluster3/levels.json

Layouts are ``RxNxK``: R racks of N nodes of K ranks (:class:`collectives.model.network.Network`). The
emulated cluster runs every rank on one host, so every layout's oversubscription is P / cores (cores
from the sweep's provenance). The fit, per rate, in log space (every size weighs alike) from
``--min-bytes`` up:

1. ``alpha_intra``, ``beta_intra`` and ``gamma`` on the shared-memory sweeps (``--intra``: one node,
   P = 2 and 4, so the oversubscription is 1 and 2);
2. ``alpha_node``, ``beta_node``, ``alpha_rack`` and ``beta_rack`` on the ``--fit`` sweeps of that
   rate, the intra-node values fixed, starting from the ``--calibrate`` figures of the rate;
3. the ``--predict`` sweeps are replayed with the fitted model; a point is a hit when the prediction is
   within ``--tolerance`` (25 %) of the measured median, scored from ``--score-bytes`` (256 KiB). ``mpi``
   is shown as measured: MPICH picks its own algorithm, which has no schedule here.

The host's oversubscription enters through the copies and reductions (``beta_intra o`` and
``gamma o``, measured on one node at P = 2 and 4). The network stack's own CPU cost (``cpu`` of
:class:`~collectives.model.network.Network`) is left at 0: on the fit layouts (P = 4, o = 2) no flow
is limited by it, so a fit can only bound it, and a value just under the link's rate there, scaled to
P = 8, halves a lone flow's rate, which the larger layout's ring does not show.

Also reported: the model from the calibration alone (every level's measured latency and bandwidth, no
fit, no CPU term), and the torus's speedup over the flat ring per size (median and range of the
passes). Writes PREFIX.json (with the provenance of the sweeps) and PREFIX.csv and prints the tables.
"""
import csv
import json
import math
import sys

import numpy as np
from scipy.optimize import least_squares

from collectives.model.network import Network, allreduce_time
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["parse_layout", "network", "fit_intra", "fit_levels", "main"]

#: Algorithms with schedules the replay covers; ``mpi`` is replayed as Rabenseifner.
SCHEDULED = ("ring", "tree", "recursive_doubling", "rabenseifner", "2d", "torus")


def parse_layout(text):
    """Return (racks, nodes per rack, ranks per node) of ``RxNxK``.

    Examples
    --------
    >>> parse_layout("2x2x2")
    (2, 2, 2)
    >>> parse_layout("2x2")
    Traceback (most recent call last):
    ...
    ValueError: layout '2x2': expected RxNxK (racks x nodes per rack x ranks per node), each >= 1
    """
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"layout {text!r}: expected RxNxK (racks x nodes per rack x ranks per node), each >= 1")
    return tuple(int(p) for p in parts)


def network(layout, cores, params):
    """The :class:`Network` of ``layout`` on one host of ``cores`` cores with ``params`` (a dict)."""
    R, N, K = layout
    return Network(racks=R, nodes_per_rack=N, ranks_per_node=K, cores=cores, ranks_per_host=R * N * K, **params)


def _rows(data, min_bytes, mpi=False):
    return [r for r in data["rows"] if r.get("collective") == "allreduce" and r["bytes"] >= min_bytes and r["time_s"] > 0
            and (r["algorithm"] in SCHEDULED or (mpi and r["algorithm"] == "mpi"))]


def _predict(layout, cores, params, row):
    return allreduce_time(row["algorithm"], row["bytes"], network(layout, cores, params))


def _solve(residuals, start):
    sol = least_squares(residuals, np.log(start), diff_step=1e-3)
    return np.exp(sol.x), float(np.sqrt(np.mean(np.square(sol.fun))))


def fit_intra(sweeps, cores):
    """Fit ``alpha_intra``, ``beta_intra`` and ``gamma`` to one-node sweeps ``[(P, rows)]``.

    Returns
    -------
    dict
        The three values and ``rms_log_error``.
    """
    def residuals(x):
        a, b, g = np.exp(x)
        params = dict(alpha_intra=a, beta_intra=b, gamma=g)
        return [math.log(_predict((1, 1, P), cores, params, r) / r["time_s"])
                for P, rows in sweeps for r in rows]

    (a, b, g), err = _solve(residuals, (5e-6, 1 / 2e9, 1 / 2e9))
    return {"alpha_intra": float(a), "beta_intra": float(b), "gamma": float(g), "rms_log_error": err}


#: The inter-node parameters fitted per rate, in this order (``cpu`` is not fitted: see the module docstring).
LEVEL_PARAMS = ("alpha_node", "beta_node", "alpha_rack", "beta_rack")


def fit_levels(sweeps, cores, intra, start):
    """Fit :data:`LEVEL_PARAMS` to emulated sweeps ``[(layout, rows)]`` with the intra values fixed.

    Parameters
    ----------
    start : dict
        Starting values of :data:`LEVEL_PARAMS` (from the calibration).

    Returns
    -------
    dict
        The fitted values and ``rms_log_error``.
    """
    fixed = {k: intra[k] for k in ("alpha_intra", "beta_intra", "gamma")}

    def residuals(x):
        params = dict(fixed, cpu=0.0, **dict(zip(LEVEL_PARAMS, np.exp(x))))
        return [math.log(_predict(layout, cores, params, r) / r["time_s"])
                for layout, rows in sweeps for r in rows]

    values, err = _solve(residuals, [start[k] for k in LEVEL_PARAMS])
    return dict(zip(LEVEL_PARAMS, map(float, values)), rms_log_error=err)


def _from_calibration(calib):
    """The level parameters the calibration measured (latency, bandwidth; no CPU term) and fit starts."""
    lv = calib["summary"]["levels"]
    node, rack = lv["inter-node"], lv.get("inter-rack", lv["inter-node"])
    alpha_node = node["latency_us"] * 1e-6
    return {"alpha_node": alpha_node, "beta_node": 8 / node["bandwidth_bps"],
            "alpha_rack": max(rack["latency_us"] * 1e-6 - alpha_node, 1e-7), "beta_rack": 8 / rack["bandwidth_bps"]}


def _load(item, p, need_layout=True):
    key, _, path = item.partition("=")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return (parse_layout(key) if need_layout else key), data
    except (ValueError, OSError) as e:
        p.error(f"{item}: {e} (expected {'RxNxK' if need_layout else 'RATE'}=FILE)")


def _cores(data):
    return int(data.get("provenance", {}).get("cores") or data.get("cpus") or 0)


def _provenance(files, command):
    """One provenance for the study: the sweeps' versions, the largest load seen, noisy if any was."""
    provs = [d.get("provenance") or {} for d in files]
    loads = [p.get("load") or {} for p in provs]
    first = next((p for p in provs if p.get("versions")), {})
    return {"command": command, "versions": first.get("versions", {}), "P": max(p.get("P") or 0 for p in provs),
            "cores": first.get("cores"), "date": max(p.get("date", "") for p in provs),
            "max_load": first.get("max_load"),
            "load": {"before": max(x.get("before", 0.0) for x in loads),
                     "during_max": max(x.get("during_max", 0.0) for x in loads)},
            "noisy": any(p.get("noisy", True) for p in provs)}


def _speedups(rows):
    """Per size: the torus's speedup over the flat ring, median and range over the passes."""
    by = {(r["algorithm"], r["bytes"]): r for r in rows}
    out = {}
    for (alg, n), r in sorted(by.items(), key=lambda kv: kv[0][1]):
        ring = by.get(("ring", n))
        if alg != "torus" or ring is None:
            continue
        ratios = [a / b for a, b in zip(ring["time_repeats_us"], r["time_repeats_us"])]
        out[n] = (float(np.median(ratios)), min(ratios), max(ratios))
    return out


def _score(rows, key, tolerance, score_bytes):
    pts = [r for r in rows if r["bytes"] >= score_bytes]
    hits = sum(abs(r[key]) <= tolerance for r in pts)
    return {"hits": hits, "points": len(pts), "fraction": hits / len(pts) if pts else None}


def main(argv=None):
    """Fit, predict, write PREFIX.json and PREFIX.csv and print the tables; return the exit status."""
    from commlab.provenance import command_line
    from plots.levels import markdown

    p = Parser(prog="python -m experiments.cluster.levels", description=__doc__.split("\n\n")[0])
    p.add_argument("--intra", type=text(), action="append", default=[], help="bench_collectives JSON of one node (shared memory)")
    p.add_argument("--calibration", type=text(), action="append", default=[], help="RATE=FILE: the emulator's --calibrate JSON")
    p.add_argument("--fit", type=text(), action="append", default=[], help="RATE/RxNxK=FILE: a sweep to fit on")
    p.add_argument("--predict", type=text(), action="append", default=[], help="RATE/RxNxK=FILE: a sweep to predict")
    p.add_argument("--min-bytes", type=integer(1, INT32_MAX), default=64 << 10, help="smallest size fitted and shown (64 KiB)")
    p.add_argument("--score-bytes", type=integer(1, INT32_MAX), default=256 << 10, help="smallest size scored (256 KiB)")
    p.add_argument("--tolerance", type=real(0, 1e15, low_open=True), default=0.25, help="relative error counted as a hit (0.25)")
    p.add_argument("--out", type=outpath(), default="results/cluster3/levels", help="path prefix of the .json and .csv")
    a = p.parse_args(argv)
    if not a.intra or not a.calibration or not a.fit or not a.predict:
        p.error("give --intra, --calibration, --fit and --predict")
    intra_files = [_load(f"x={path}", p, False)[1] for path in a.intra]
    calib = dict(_load(item, p, False) for item in a.calibration)

    def grouped(items):
        out = {}
        for item in items:
            rate, _, rest = item.partition("/")
            layout, data = _load(rest, p)
            if rate not in calib:
                p.error(f"{item}: no --calibration {rate}=FILE")
            out.setdefault(rate, []).append((layout, data))
        return out

    fits, preds = grouped(a.fit), grouped(a.predict)
    everything = intra_files + [d for group in (fits, preds) for v in group.values() for _, d in v]
    cores = _cores(everything[0])
    intra = fit_intra([(d["P"], _rows(d, a.min_bytes)) for d in intra_files], cores)
    fixed = {k: intra[k] for k in ("alpha_intra", "beta_intra", "gamma")}
    result = {"study": "experiments.cluster.levels", "cores": cores, "intra": intra, "tolerance": a.tolerance,
              "min_bytes": a.min_bytes, "score_bytes": a.score_bytes, "rates": {}, "rows": []}
    for rate, sweeps in preds.items():
        start = _from_calibration(calib[rate])
        levels = fit_levels([(lay, _rows(d, a.min_bytes)) for lay, d in fits.get(rate, [])], cores, intra, start)
        fitted = dict(fixed, cpu=0.0, **{k: levels[k] for k in LEVEL_PARAMS})
        measured_only = dict(fixed, cpu=0.0, **start)
        rows = []
        for layout, data in sweeps:
            mpi = {str(r["bytes"]): r["time_s"] for r in _rows(data, a.min_bytes, True) if r["algorithm"] == "mpi"}
            for r in _rows(data, a.min_bytes):
                if r["algorithm"] == "mpi":
                    continue
                t, c = _predict(layout, cores, fitted, r), _predict(layout, cores, measured_only, r)
                reps = [x * 1e-6 for x in r.get("time_repeats_us", [r["time_s"] * 1e6])]
                rows.append({"rate": rate, "layout": "x".join(map(str, layout)), "algorithm": r["algorithm"],
                             "bytes": r["bytes"], "measured_s": r["time_s"], "measured_min_s": min(reps),
                             "measured_max_s": max(reps), "predicted_s": t, "rel_error": t / r["time_s"] - 1,
                             "calibration_s": c, "calibration_error": c / r["time_s"] - 1})
            result["rates"][rate] = {
                "calibration": start, "fit": levels, "layout": "x".join(map(str, layout)),
                "torus_speedup": {str(n): v for n, v in _speedups(_rows(data, a.min_bytes)).items()},
                "mpi_measured_s": mpi,
                "fitted": _score(rows, "rel_error", a.tolerance, a.score_bytes),
                "calibration_only": _score(rows, "calibration_error", a.tolerance, a.score_bytes)}
        result["rows"] += rows
    result["provenance"] = _provenance(everything, command_line("experiments.cluster.levels",
                                                                sys.argv[1:] if argv is None else argv))
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(result["rows"][0]))
        w.writeheader()
        w.writerows(result["rows"])
    print(markdown(result))
    print(f"wrote {a.out}.json and {a.out}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
