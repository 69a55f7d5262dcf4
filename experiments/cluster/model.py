"""Calibrate the two-level alpha-beta simulator on the emulated cluster, then predict a larger layout.

    python -m experiments.cluster.model --intra results/cluster/fit_1x4.json \\
        --fit 2=results/cluster/fit_2x2.json --fit 1=results/cluster/fit_4x1.json \\
        --predict 2=results/cluster/collectives_1gbit.json --predict 2=results/cluster/fit_4x2_rd.json \\
        --out results/cluster/model

The inputs are ``bench_collectives`` sweeps run under :mod:`training.emulator.emulate` (``K=FILE``: the
sweep ran with K ranks per node, rank r on node r // K). The model is
:class:`collectives.model.cost.Topology` (R. Thakur, R. Rabenseifner and W. Gropp, IJHPCA 19(1), 2005,
section 3, on two levels): a message of n bytes costs ``alpha + n beta`` inside a node or between
nodes, and reducing n bytes costs ``n gamma``.

1. Intra-node: ``alpha_intra``, ``beta_intra`` and ``gamma`` by :func:`collectives.model.cost.fit` on the
   single-node (shared-memory) sweep ``--intra``, rows of at least ``--min-bytes``.
2. Inter-node: ``alpha_inter`` and ``beta_inter`` by least squares on the log of simulated over
   measured time (so every size weighs alike) over the ``--fit`` sweeps, replaying every
   algorithm's own schedules (:func:`collectives.model.simulate.replay`) with the intra values fixed.
3. Predict the ``--predict`` sweeps (a layout not used in the fit) and count the points within
   ``--tolerance`` (25 %).

Two replays are fitted and compared: ``independent`` (every message has its link to itself, as
:func:`collectives.model.cost.simulate` assumes) and ``shared`` (the node's one link is shared: an
inter-node message of round k costs ``alpha_inter + n beta_inter s``, with s the number of ranks
of its sender's node sending across, or of its receiver's node receiving across, in round k of their
schedules, the larger; one rank's own messages of a round are already sent one after another). Writes PREFIX.json and PREFIX.csv and prints the comparison and the
``experiments.studies.scale_sim`` command that extrapolates the shared-link fit to 4,096 ranks.
"""
import csv
import json
import math
import sys
from collections import defaultdict

import numpy as np
from scipy.optimize import least_squares

from collectives.model import cost
from collectives.schedules.registry import build_allreduce_schedule
from collectives.model.simulate import replay
from training.settings.options import INT32_MAX, Parser, integer, outpath, real, text

__all__ = ["simulate", "fit_inter", "main"]

#: Algorithms with schedules the replay covers.
ALGS = ("ring", "tree", "recursive_doubling", "rabenseifner", "2d")


def simulate(algorithm, P, nbytes, topo, shared, itemsize=4):
    """Return the replayed all-reduce time in seconds (the slowest rank's clock).

    Parameters
    ----------
    algorithm : str
        One of :data:`ALGS`; ``2d`` runs on the (nodes, ranks per node) grid.
    P, nbytes : int
        Ranks and message size in bytes.
    topo : collectives.model.cost.Topology
        Two-level parameters; rank r on node r // ``topo.ranks_per_node``.
    shared : bool
        Share each node's link among the inter-node messages of one round (see the module docstring).
    itemsize : int
        Bytes per element.
    """
    K = topo.ranks_per_node
    grid = (P // K, K) if algorithm == "2d" and P % K == 0 and P > K else None
    count = int(nbytes) // itemsize
    scheds = [build_allreduce_schedule(algorithm, r, P, count, grid) for r in range(P)]
    egress, ingress = defaultdict(set), defaultdict(set)  # (node, round) -> ranks sending / receiving across
    for r, s in enumerate(scheds):
        for k, rd in enumerate(s.rounds):
            for p, a, b in rd.sends:
                if p // K != r // K and b > a:
                    egress[(r // K, k)].add(r)
                    ingress[(p // K, k)].add(p)
    factors = []  # per rank, the share factor of each send in posting order
    for r, s in enumerate(scheds):
        f = []
        for k, rd in enumerate(s.rounds):
            for p, a, b in rd.sends:
                inter = p // K != r // K
                f.append(max(len(egress[(r // K, k)]), len(ingress[(p // K, k)])) if inter and shared else 1)
        factors.append(f)
    calls = [0] * P

    def link(src, dst, n):
        share = factors[src][calls[src]]
        calls[src] += 1
        if src // K == dst // K:
            t = topo.alpha_intra + n * itemsize * topo.beta_intra
        else:
            t = topo.alpha_inter + n * itemsize * topo.beta_inter * share
        return t, t

    out = replay(scheds, cost=link, reduce_cost=lambda n: n * itemsize * topo.gamma)
    return max(out["clock"])


def _rows(data, min_bytes):
    return [r for r in data["rows"] if r.get("collective") == "allreduce" and r["algorithm"] in ALGS
            and r["bytes"] >= min_bytes and r["time_s"] > 0]


def fit_inter(runs, intra, shared, guess):
    """Fit ``alpha_inter`` and ``beta_inter`` to the sweeps ``runs`` = [(K, rows)].

    Returns
    -------
    dict
        ``alpha_inter`` (s), ``beta_inter`` (s/byte) and ``rms_log_error``.
    """
    def residuals(x):
        a, b = np.exp(x)
        out = []
        for K, rows in runs:
            topo = cost.Topology(ranks_per_node=K, alpha_intra=intra["alpha"], beta_intra=intra["beta"],
                                 alpha_inter=a, beta_inter=b, gamma=intra["gamma"])
            out += [math.log(simulate(r["algorithm"], r["P"], r["bytes"], topo, shared) / r["time_s"]) for r in rows]
        return out

    sol = least_squares(residuals, np.log(guess), x_scale=1.0, diff_step=1e-3)
    a, b = np.exp(sol.x)
    return {"alpha_inter": float(a), "beta_inter": float(b),
            "rms_log_error": float(np.sqrt(np.mean(np.square(sol.fun))))}


def _load(items, p):
    out = []
    for item in items:
        K, _, path = item.partition("=")
        try:
            with open(path, encoding="utf-8") as f:
                out.append((int(K), json.load(f)))
        except (ValueError, OSError) as e:
            p.error(f"{item}: {e} (expected K=FILE)")
    return out


def main(argv=None):
    """Fit, predict, write PREFIX.json and PREFIX.csv, print the result; return the exit status."""
    p = Parser(prog="python -m experiments.cluster.model", description=__doc__.split("\n")[0])
    p.add_argument("--intra", type=text(), required=True, help="bench_collectives JSON of one node (shared memory)")
    p.add_argument("--fit", type=text(), action="append", default=[], help="K=FILE: sweep with K ranks per node to fit on")
    p.add_argument("--predict", type=text(), action="append", default=[], help="K=FILE: sweep with K ranks per node to predict")
    p.add_argument("--min-bytes", type=integer(1, INT32_MAX), default=64 << 10, help="smallest size used and scored (64 KiB)")
    p.add_argument("--tolerance", type=real(0, 1e15, low_open=True), default=0.25, help="relative error counted as a hit (0.25)")
    p.add_argument("--link-bps", type=real(0, 1e15, low_open=True), default=1e9, help="configured link rate, bits/s (start of the fit)")
    p.add_argument("--out", type=outpath(), default="results/cluster/model", help="path prefix of the .json and .csv")
    a = p.parse_args(argv)
    if not a.fit or not a.predict:
        p.error("give at least one --fit and one --predict sweep")
    with open(a.intra, encoding="utf-8") as f:
        intra = cost.fit(_rows(json.load(f), a.min_bytes), min_bytes=a.min_bytes)
    fits = [(K, _rows(d, a.min_bytes)) for K, d in _load(a.fit, p)]
    preds = [(K, _rows(d, a.min_bytes)) for K, d in _load(a.predict, p)]
    guess = (50e-6, 8 / a.link_bps)
    result = {"study": "experiments.cluster.model", "intra": intra, "tolerance": a.tolerance,
              "min_bytes": a.min_bytes, "fit_files": a.fit, "predict_files": a.predict, "models": {}}
    rows = []
    for shared in (False, True):
        name = "shared" if shared else "independent"
        inter = fit_inter(fits, intra, shared, guess)
        hits = 0
        for K, rs in preds:
            topo = cost.Topology(ranks_per_node=K, alpha_intra=intra["alpha"], beta_intra=intra["beta"],
                                 alpha_inter=inter["alpha_inter"], beta_inter=inter["beta_inter"], gamma=intra["gamma"])
            for r in rs:
                t = simulate(r["algorithm"], r["P"], r["bytes"], topo, shared)
                err = t / r["time_s"] - 1
                hits += abs(err) <= a.tolerance
                rows.append({"model": name, "P": r["P"], "ranks_per_node": K, "algorithm": r["algorithm"],
                             "bytes": r["bytes"], "measured_s": r["time_s"], "predicted_s": t, "rel_error": err})
        n = sum(len(rs) for _, rs in preds)
        result["models"][name] = dict(inter, hits=int(hits), points=n, hit_fraction=hits / n if n else None)
    result["rows"] = rows
    with open(a.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]) if rows else ["model"])
        w.writeheader()
        w.writerows(rows)
    print(f"intra-node (shared memory): alpha {intra['alpha'] * 1e6:.2f} us, beta {1 / intra['beta'] / 1e9 if intra['beta'] else float('inf'):.2f} GB/s, "
          f"gamma {1 / intra['gamma'] / 1e9 if intra['gamma'] else float('inf'):.2f} GB/s ({intra['rows']} rows)")
    for name, m in result["models"].items():
        print(f"{name}: alpha_inter {m['alpha_inter'] * 1e6:.1f} us, beta_inter {1 / m['beta_inter'] / 1e6:.1f} MB/s, "
              f"fit rms log error {m['rms_log_error']:.3f}; predicted within {a.tolerance:.0%}: "
              f"{m['hits']} of {m['points']} points ({m['hit_fraction']:.0%})")
    print(f"{'model':<12}{'alg':<20}{'size':>10}{'measured ms':>13}{'predicted ms':>14}{'error':>9}")
    for r in rows:
        print(f"{r['model']:<12}{r['algorithm']:<20}{r['bytes'] >> 10:>8}Ki{r['measured_s'] * 1e3:>13.1f}"
              f"{r['predicted_s'] * 1e3:>14.1f}{r['rel_error']:>+9.0%}")
    m = result["models"]["shared"]
    print("extrapolate with the shared-link fit (scale_sim's simulator gives every rank its own link): "
          "python -m experiments.studies.scale_sim --ranks-per-node "
          f"{preds[0][0]} --alpha-intra {intra['alpha']:.3g} --beta-intra {intra['beta']:.3g} --alpha-inter "
          f"{m['alpha_inter']:.3g} --beta-inter {m['beta_inter']:.3g} --gamma {intra['gamma']:.3g}")
    print(f"wrote {a.out}.json and {a.out}.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
