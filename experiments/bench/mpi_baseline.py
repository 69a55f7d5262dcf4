"""A best-of-MPI baseline: commlab's best all-reduce against the best the MPI library can do, per size.

    python -m experiments.bench.mpi_baseline -n 2 [--min-bytes 64K] [--max-bytes 64M] [--rounds 3]
        [--max-time 0.1] [--bind core] [--out results/mpi_baseline_p2] [--max-load L] [--allow-noisy]

MPI libraries pick one all-reduce algorithm per (P, size) from built-in thresholds, which need not be
the best one on a given machine; comparing commlab against that default flatters commlab. This
command runs the all-reduce sweep of :mod:`experiments.bench.collectives` once with commlab's
hand-made algorithms (and MPI's default ``MPI_Allreduce`` beside them), then once per algorithm of
the MPI library, forced through its own control variables -- MPICH: ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``
with ``MPIR_CVAR_DEVICE_COLLECTIVES=none`` (so the device layer does not override the choice); Open
MPI: ``OMPI_MCA_coll_tuned_use_dynamic_rules=1`` and ``OMPI_MCA_coll_tuned_allreduce_algorithm`` --
timing ``MPI_Allreduce`` called directly. Every launch goes through the library's own ``mpiexec``.

The whole set of launches is repeated ``--rounds`` times, one round after another, so that a shared
machine's load drifts over all of them alike. Per size and round, best-of-MPI is the fastest forced
algorithm and commlab's best the fastest hand-made one; the ratio of their times is busbw(commlab) /
busbw(best of MPI). Reported: per size the median ratio over rounds, its range and the winners; the
geometric mean over ``--min-bytes``..``--max-bytes`` per round, then its median and range. Rank 0 of each launch writes its sweep; this process writes PREFIX.json
with its ``provenance`` (:mod:`commlab.provenance`). This process checks the machine is quiet before the
first launch and watches its load through all of them (the launches themselves run ``--allow-noisy``:
the load the previous launch left in the 1-minute average must not stop the next).
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from commlab.job_control import marked_env, stop_job
from experiments import harness
from commlab.byte_sizes import parse_bytes
from training.emulator.launch import default_mpiexec, flavour as launcher_flavour
from training.settings.options import INT32_MAX, byte_count, integer, outpath, real, text

__all__ = ["MPICH_ALGORITHMS", "OPENMPI_ALGORITHMS", "configurations", "combine", "STUDY", "main"]

#: MPICH 4-5 all-reduce algorithms (``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` values).
MPICH_ALGORITHMS = ("recursive_doubling", "recursive_multiplying", "reduce_scatter_allgather", "tree", "recexch",
                    "ring", "k_reduce_scatter_allgather", "smp", "nb")
#: Open MPI's ``coll_tuned_allreduce_algorithm`` values (1..6; 0 is the tuned decision).
OPENMPI_ALGORITHMS = {"basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
                      "segmented_ring": 5, "rabenseifner": 6}
_HAND_MADE = ("ring", "tree", "recursive_doubling", "rabenseifner", "2d")


def configurations(flavour):
    """Return ``[(name, environment)]``: commlab's run (default library settings), then one per forced algorithm."""
    runs = [("commlab", {})]
    if flavour == "openmpi":
        for name, number in OPENMPI_ALGORITHMS.items():
            runs.append((f"ompi:{name}", {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                                          "OMPI_MCA_coll_tuned_allreduce_algorithm": str(number)}))
    else:
        for name in MPICH_ALGORITHMS:
            runs.append((f"mpich:{name}", {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": name,
                                           "MPIR_CVAR_DEVICE_COLLECTIVES": "none"}))
    return runs


def _launch(args, name, env, prefix):
    """Run one sweep under ``mpiexec``; return its parsed results (None when it failed)."""
    algorithms = ",".join(_HAND_MADE + ("MPI_Allreduce",)) if name == "commlab" else "MPI_Allreduce"
    cmd = [default_mpiexec()] + (["-bind-to", args.bind] if args.bind else []) + [
        "-n", str(args.n), sys.executable, "-m", "experiments.bench.collectives", "--ops", "allreduce",
        "--algorithms", algorithms, "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
        "--warmup-small", "20", "--warmup-large", "3", "--max-time", str(args.max_time), "--rounds", "3",
        "--repeats", "1", "--out", prefix, "--allow-noisy"]  # main() guards the whole run
    marked, mark = marked_env({**os.environ, **env})
    proc = subprocess.Popen(cmd, env=marked, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=args.launch_timeout)
    except subprocess.TimeoutExpired:  # end the launcher and every rank it started (commlab.job_control)
        stop_job(proc, mark)
        out, err = proc.communicate()
        print(f"# {name}: stopped after --launch-timeout {args.launch_timeout:g} s\n{out[-2000:]}{err[-2000:]}",
              flush=True)
        return None
    if proc.returncode != 0:
        print(f"# {name}: exit {proc.returncode}\n{out[-2000:]}{err[-2000:]}", flush=True)
        return None
    with open(prefix + ".json", encoding="utf-8") as f:
        return json.load(f)


def combine(rounds, lo, hi):
    """Return the per-size table and the aggregate of rounds of launches.

    Parameters
    ----------
    rounds : list of dict
        One ``{configuration name: results}`` per round.
    lo, hi : int
        Byte range of the geometric mean.

    Returns
    -------
    dict
        ``sizes``: per size ``ratio_median``, ``ratio_min``, ``ratio_max`` (best-of-MPI time / commlab's
        best time), ``commlab_best`` and ``mpi_best`` (the winners of the median round), ``mpi_default_ratio``
        (``MPI_Allreduce`` with default settings / commlab's best); ``geomean``: median, min, max over
        rounds of the per-round geometric mean over ``lo``..``hi``.
    """
    per_round = []  # [{bytes: (ratio, commlab winner, mpi winner, default ratio)}]
    for runs in rounds:
        got = {}
        mine = runs.get("commlab")
        if mine is None:
            continue
        t = {}
        for name, res in runs.items():
            if res is None:
                continue
            for r in res["rows"]:
                if r["wrong"]:
                    continue
                if name == "commlab" and r["algorithm"] in _HAND_MADE:
                    t.setdefault(r["bytes"], {}).setdefault("hand", {})[r["algorithm"]] = r["time_s"]
                elif r["algorithm"] == "MPI_Allreduce":
                    label = "default" if name == "commlab" else name
                    t.setdefault(r["bytes"], {}).setdefault("mpi", {})[label] = r["time_s"]
        for n, e in t.items():
            hand, lib = e.get("hand", {}), {k: v for k, v in e.get("mpi", {}).items() if k != "default"}
            if hand and lib:
                h, m = min(hand, key=hand.get), min(lib, key=lib.get)
                default = e["mpi"].get("default")
                got[n] = (lib[m] / hand[h], h, m, default / hand[h] if default else None)
        per_round.append(got)
    sizes = []
    for n in sorted({n for got in per_round for n in got}):
        vals = sorted((got[n] for got in per_round if n in got), key=lambda v: v[0])
        mid = vals[len(vals) // 2]
        defaults = [v[3] for v in vals if v[3]]
        sizes.append({"bytes": n, "ratio_median": statistics.median(v[0] for v in vals), "ratio_min": vals[0][0],
                      "ratio_max": vals[-1][0], "commlab_best": mid[1], "mpi_best": mid[2], "rounds": len(vals),
                      "mpi_default_ratio": statistics.median(defaults) if defaults else None})
    means = []
    for got in per_round:
        vals = [v[0] for n, v in got.items() if lo <= n <= hi]
        if vals:
            means.append(statistics.geometric_mean(vals))
    geo = {"median": statistics.median(means), "min": min(means), "max": max(means), "rounds": len(means)} \
        if means else None
    return {"sizes": sizes, "geomean": geo}


def _options(p):
    p.add_argument("-n", type=integer(1, INT32_MAX), default=2, help="ranks (default 2)")
    p.add_argument("--min-bytes", type=byte_count(1), default="64K", help="smallest size (default 64K)")
    p.add_argument("--max-bytes", type=byte_count(1), default="64M", help="largest size (default 64M)")
    p.add_argument("--rounds", type=integer(1, INT32_MAX), default=3, help="rounds of launches (median and range; default 3)")
    p.add_argument("--max-time", type=real(0, 1e15), default=0.1, help="seconds per timed loop (default 0.1)")
    p.add_argument("--bind", type=text(), default="", help="mpiexec -bind-to value (core, ...; default: none)")
    p.add_argument("--only", type=text(), default="", help="comma list of forced algorithms to run (default all)")
    p.add_argument("--launch-timeout", type=real(0, 1e15), default=900, help="seconds one launch may take (default 900)")
    p.add_argument("--out", type=outpath(empty=True), default=None, help="PREFIX of PREFIX.json (default results/mpi_baseline_pN)")


def _range(args, comm=None):
    """Return (--min-bytes, --max-bytes) in bytes; raise ValueError on a bad argument."""
    if args.n < 2 or args.max_time <= 0:
        raise ValueError("-n must be >= 2 and --max-time > 0")
    try:
        lo, hi = parse_bytes(args.min_bytes, minimum=1), parse_bytes(args.max_bytes, minimum=1)
    except ValueError as exc:
        raise ValueError(f"--min-bytes / --max-bytes: {exc}") from None
    if lo > hi:  # every launch would refuse it: say so once, before any
        raise ValueError(f"--min-bytes ({args.min_bytes}) is larger than --max-bytes ({args.max_bytes})")
    return lo, hi


def _run(args, comm):
    """Launch the rounds (this driver runs alone, its launches measure); print the table, return the record."""
    lo, hi = _range(args)
    flavour = launcher_flavour(default_mpiexec())  # ValueError: neither MPICH's nor Open MPI's launcher
    runs = configurations(flavour)
    if args.only:
        keep = set(args.only.split(","))
        runs = [(n, e) for n, e in runs if n == "commlab" or n.split(":", 1)[1] in keep]
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            got = {}
            for name, env in runs:
                got[name] = _launch(args, name, env, os.path.join(tmp, f"r{k}-{name.replace(':', '-')}"))
                print(f"# round {k + 1}/{args.rounds}: {name} {'done' if got[name] else 'FAILED'}", flush=True)
            rounds.append(got)
    result = combine(rounds, lo, hi)
    result.update(P=args.n, flavour=flavour, rounds=args.rounds, configurations=[n for n, _ in runs],
                  load_average=list(os.getloadavg()), bind=args.bind or None, range_bytes=[lo, hi],
                  library=next((r.get("mpi_library") for g in rounds for r in g.values() if r), None))
    print(f"\nP = {args.n}, {result['library']}: best-of-{flavour} time / commlab's best time "
          f"(= commlab busbw / best-of-MPI busbw), median [range] over {args.rounds} rounds")
    print(f"{'size':>10} {'ratio':>7} {'range':>13} {'default MPI':>11}  commlab best / MPI best")
    for e in result["sizes"]:
        d = f"{e['mpi_default_ratio']:.2f}" if e["mpi_default_ratio"] else "-"
        print(f"{e['bytes']:>10} {e['ratio_median']:>7.2f} {e['ratio_min']:>6.2f}-{e['ratio_max']:<6.2f} {d:>11}  "
              f"{e['commlab_best']} / {e['mpi_best']}")
    g = result["geomean"]
    if g:
        print(f"geometric mean over {args.min_bytes}-{args.max_bytes}: {g['median']:.2f}x "
              f"(range {g['min']:.2f}-{g['max']:.2f}x over {g['rounds']} rounds)")
    return result


#: The baseline as a unit of the harness; ``main(argv)`` writes PREFIX.json and returns 0 when the geometric
#: mean was measured, 1 when no round gave one, 2 after one error line on a bad argument or a busy machine.
STUDY = harness.Study("experiments.bench.mpi_baseline", __doc__.split("\n\n")[0], _options, _run, out=None,
                      check=_range, results=lambda args: (args.out or f"results/mpi_baseline_p{args.n}") + ".json",
                      ranks=lambda args, comm: args.n, status=lambda r: 0 if r["geomean"] else 1, mpi=False)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
