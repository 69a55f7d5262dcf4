"""Predict all-reduce time against P (up to 4096) on a two-level topology with the schedule simulator.

Run: ``python -m experiments.studies.scale_sim [--out results/scale_sim.json]`` (one process, no MPI launch
needed). Each algorithm's own schedules are replayed by :func:`collectives.model.cost.simulate` at 1 KiB,
1 MiB and 256 MiB (``--sizes``) for P = 8, 16, ..., 4096 (``--max-p``) with ``--ranks-per-node``
ranks per node. Link parameters default to a typical cluster (intra-node 1 us, 20 GB/s; inter-node
5 us, 12.5 GB/s; reduction 10 GB/s) and can be set by flags or taken from a fit (``--fit RESULTS.json``
from ``experiments.bench.collectives``, whose alpha/beta/gamma then replace the intra-node values).
The table printed at the end names, per size, the smallest P from which 2D and tree stay faster than ring.
The results file carries a ``provenance`` (:func:`commlab.provenance.stamp`: command, versions, host,
date, the load before and during) with ``noisy`` false: a simulation measures nothing, so the machine's
load is recorded but never stops it nor marks it.
"""
import argparse
import json
import math
import platform
import time

from collectives.model import cost
from collectives.schedules import load_algorithm, registry
from commlab import provenance as prov
from commlab.provenance import command_line, unwritable
from commlab.byte_sizes import bytes_argument, format_bytes
from training.settings.options import INT32_MAX, Parser, integer, outpath, parsed_by, real, text

__all__ = ["main", "crossovers"]

ALGS = ("ring", "tree", "recursive_doubling", "rabenseifner", "2d")
_message_size = bytes_argument(minimum=1)  # one --sizes entry, in bytes


def _check_out(path):
    """Return why the results file ``path`` cannot be written, or None."""
    why = unwritable(path)
    return f"--out: {why}" if why else None


def _read_fit(path):
    """Return alpha, beta, gamma fitted to the bench_collectives results file ``path``."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) \
            or not all(isinstance(r, dict) for r in data["rows"]):
        raise ValueError("not an experiments.bench.collectives results file (no list of rows)")
    try:
        return cost.fit(data["rows"], min_bytes=1 << 16)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an experiments.bench.collectives results file (bad row: {exc!r})")


def crossovers(rows):
    """Return ``{size: {alg: smallest P from which alg stays faster than ring, or None}}``."""
    out = {}
    algs = [a for a in dict.fromkeys(r["algorithm"] for r in rows) if a != "ring"]
    for size in sorted({r["bytes"] for r in rows}):
        at = {(r["algorithm"], r["P"]): r["time_s"] for r in rows if r["bytes"] == size}
        ps = sorted({p for _, p in at})
        out[size] = {}
        for a in algs:
            wins = [at[(a, p)] < at[("ring", p)] for p in ps]
            out[size][a] = next((p for i, p in enumerate(ps) if all(wins[i:])), None)
    return out


def main(argv=None):
    """Simulate every algorithm at every P and size, print a table and write the results JSON."""
    ap = Parser(prog="python -m experiments.studies.scale_sim", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--sizes", type=parsed_by(lambda s: [_message_size(x) for x in s.split(",")], 'message sizes, comma-separated, e.g. 1KiB,1MiB,256MiB'), default="1KiB,1MiB,256MiB",
                    help="message sizes, comma-separated, e.g. 1KiB,1MiB,256MiB")
    ap.add_argument("--max-p", type=integer(1, INT32_MAX), default=4096, help="largest P, a power of two")
    ap.add_argument("--algorithms", type=text(), default=",".join(ALGS),
                    help="comma list of all-reduce algorithms (ring is always added: the table compares with it); "
                         "FILE.py:FUNCTION or module:FUNCTION adds a schedule builder of one's own, verified first")
    ap.add_argument("--ranks-per-node", type=integer(1, INT32_MAX), default=8, help="ranks per node")
    ap.add_argument("--alpha-intra", type=real(0, 1e15, low_open=True), default=1e-6, help="intra-node latency, seconds")
    ap.add_argument("--beta-intra", type=real(0, 1e15, low_open=True), default=1 / 20e9, help="intra-node seconds per byte")
    ap.add_argument("--alpha-inter", type=real(0, 1e15, low_open=True), default=5e-6, help="inter-node latency, seconds")
    ap.add_argument("--beta-inter", type=real(0, 1e15, low_open=True), default=1 / 12.5e9, help="inter-node seconds per byte")
    ap.add_argument("--gamma", type=real(0, 1e15, low_open=True), default=1 / 10e9, help="reduction seconds per byte")
    ap.add_argument("--fit", type=text(), help="bench_collectives results JSON: fit alpha/beta/gamma and use them intra-node")
    ap.add_argument("--out", type=outpath(), default="results/scale_sim.json", help="results JSON path")
    args = ap.parse_args(argv)
    if args.max_p < 8 or args.max_p & (args.max_p - 1):
        ap.error("--max-p must be a power of two >= 8")
    if args.ranks_per_node < 1:
        ap.error(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    for name in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value >= 0):
            ap.error(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}")
    if why := _check_out(args.out):
        ap.error(why)
    if args.fit:
        try:
            fitted = _read_fit(args.fit)
        except OSError as exc:
            ap.error(f"--fit {args.fit!r}: {exc.strerror or exc}")
        except ValueError as exc:  # json.JSONDecodeError included
            ap.error(f"--fit {args.fit!r}: {exc}")
        args.alpha_intra, args.beta_intra, args.gamma = fitted["alpha"], fitted["beta"], fitted["gamma"]
    try:
        topo = cost.Topology(args.ranks_per_node, args.alpha_intra, args.beta_intra, args.alpha_inter,
                             args.beta_inter, args.gamma)
    except ValueError as exc:  # a fit that gives a negative parameter
        ap.error(f"--fit {args.fit!r} gives unusable link parameters: {exc}" if args.fit else str(exc))
    try:  # a builder of one's own is verified and registered first, then replayed like the built-in ones
        algs = list(dict.fromkeys(["ring"] + [load_algorithm(a.strip()) for a in args.algorithms.split(",") if a.strip()]))
    except ValueError as exc:
        ap.error(f"--algorithms: {exc}")
    if bad := [a for a in algs if a not in cost.MODELLED and a not in registry.names() or a in ("mpi", "auto")]:
        ap.error(f"--algorithms: {', '.join(bad)} cannot be simulated (hand-made all-reduce algorithms only)")
    watch = prov.LoadWatch(prov.default_max_load())  # recorded in the provenance, never a reason to refuse
    ps = [1 << k for k in range(3, args.max_p.bit_length())]
    rows, t0 = [], time.perf_counter()
    for size in args.sizes:
        for P in ps:
            for alg in algs:
                rows.append({"algorithm": alg, "P": P, "bytes": size, "time_s": cost.simulate(alg, P, size, topo)})
        print(f"{format_bytes(size):>12}  " + "  ".join(f"{a}={r['time_s'] * 1e3:.3g}ms" for a, r in
                                             zip(algs, rows[-len(algs):])) + f"  (P={ps[-1]})")
    cross = crossovers(rows)
    print("\nsmallest P from which an algorithm stays faster than ring:")
    for size, c in cross.items():
        print(f"  {format_bytes(size):>12}: " + ", ".join(f"{a} at P={p}" if p else f"{a} never" for a, p in c.items()))
    result = {"config": vars(args), "topology": topo.__dict__, "host": platform.node(), "rows": rows,
              "crossovers": {str(k): v for k, v in cross.items()}, "seconds": time.perf_counter() - t0}
    prov.stamp(result, watch, command=command_line("experiments.studies.scale_sim", argv))
    result["provenance"]["noisy"] = False  # simulated: the load cannot have changed a figure
    try:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    except OSError as exc:  # checked up front, but the disk may fill or the folder go meanwhile
        ap.exit(1, f"{ap.prog}: error: cannot write --out {args.out!r}: {exc.strerror or exc}\n")
    print(f"wrote {args.out} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
