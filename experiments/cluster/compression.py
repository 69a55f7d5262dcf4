"""Compression where it pays: step time and time to accuracy of every compressor, per network.

Run the whole study as one command (the compression study once per network: 4 ranks in shared memory,
then 4 nodes x 1 rank on emulated 1 Gbit/s and 100 Mbit/s links; one seed; the load average checked
before the first run and recorded while they run, :mod:`experiments.cluster.study`)::

    python -m experiments.cluster.compression run --epochs 3 --out results/cluster/compression \\
        --study results/cluster/compression_study.json
    python -m plots.cluster results/cluster/compression_study.json

``commands`` prints the runs (each writes ``DIR/NETWORK/compression_sweep.json``); ``report
shm=DIR/shm 1gbit=DIR/1gbit ...`` gathers finished runs, carrying each sweep's provenance.

From each run's logs (:func:`training.predict.validate.epoch_times`): the step time of epoch e is the time between its first
and last step over the steps between them (evaluation excluded); a compressor's step time is the
median over epochs, with their range; its speedup over ``none`` on the same network is the median (and range) of
the per-epoch ratios ``step(none) / step(compressor)``; its time to ``--target`` test accuracy is the
wall time at the end of the first epoch that reaches it (evaluated once per epoch, so it is
quantized to epochs). The accuracy cost is the final test accuracy minus ``none``'s, in points.
GRACE (H. Xu et al., "GRACE: A Compressed Communication Framework for Distributed Machine
Learning", ICDCS 2021, section V) reports the same quantities against network bandwidth.
"""
import json
import os
import sys
from statistics import median

from experiments import harness
from experiments.cluster import study
from plots.tables.cluster_tables import compression_markdown
from training.settings.options import INT32_MAX, integer, real, text
from training.predict.validate import epoch_times

__all__ = ["commands", "report", "gather", "main"]

NETWORKS = ("shm", "1gbit", "100mbit")  # shared memory, then the emulated links


def commands(out, epochs=3, seeds="0", load="", compressors=()):
    """Return the study's runs (shell lines): the compression sweep per network into ``OUT/NETWORK``.

    ``load`` is appended to each sweep's options (:func:`experiments.harness.load_flags`);
    ``compressors`` (specs) replace the sweep's list.

    Examples
    --------
    >>> cmds = commands("results/cluster/compression")
    >>> len(cmds), cmds[0].startswith("mpiexec -n 4"), "--link 100mbit" in cmds[2]
    (3, True, True)
    """
    chosen = "".join(f" --compressor {c}" for c in compressors)
    sweep = (f"python -m experiments.studies.compression_sweep --seeds {seeds} --epochs {epochs}{chosen} "
             f"--no-progress{load}")
    return [f"mpiexec -n 4 {sweep} --out {out}/shm" if net == "shm" else
            f"python -m training.emulator.emulate --nodes 4 --ranks-per-node 1 --link {net} -- {sweep} "
            f"--out {out}/{net}" for net in NETWORKS]


def report(sweeps, target):
    """Return the rows (keys :data:`_COLUMNS`) from ``{network: compression_sweep result}``."""
    rows = []
    for net, data in sweeps.items():
        runs = {r["spec"]: r for r in data["runs"] if r.get("seed", 0) == data["runs"][0].get("seed", 0)}
        base = epoch_times(runs["none"]["run_dir"]) if "none" in runs else None
        for spec, r in runs.items():
            ep = epoch_times(r["run_dir"])
            steps = [s for s, _, _ in ep]
            ratios = [b[0] / s for b, s in zip(base, steps)] if base else []
            reach = next((w for _, w, acc in ep if acc >= target), None)
            acc = r["final_test_acc"]
            rows.append({"network": net, "spec": spec, "bytes_per_step": r.get("bytes_per_step"),
                         "step_ms": median(steps) * 1e3, "step_min_ms": min(steps) * 1e3,
                         "step_max_ms": max(steps) * 1e3, "speedup": median(ratios) if ratios else None,
                         "speedup_min": min(ratios) if ratios else None, "speedup_max": max(ratios) if ratios else None,
                         "time_to_target_s": reach, "final_test_acc": acc,
                         "acc_cost_points": (acc - runs["none"]["final_test_acc"]) * 100 if "none" in runs else None})
    return rows


def gather(sweep_dirs, target, settings=None):
    """Return the study's record from ``{network: compression_sweep --out directory}`` (keys ``study``,
    ``target``, ``networks``, ``settings``, ``sources``: each sweep's P, host, configuration and
    provenance, ``rows``: :func:`report`'s)."""
    sweeps = {}
    for net, path in sweep_dirs.items():
        with open(os.path.join(path, "compression_sweep.json"), encoding="utf-8") as f:
            sweeps[net] = json.load(f)
    sources = {n: {k: d.get(k) for k in ("P", "host", "mpi_library", "config", "provenance")} for n, d in sweeps.items()}
    return {"study": "experiments.cluster.compression", "target": target, "networks": list(sweeps),
            "settings": settings, "sources": sources, "rows": report(sweeps, target)}


#: The top-level help's summary of the subcommands.
_EPILOG = ("run [--epochs E] [--seeds S] [--compressor SPEC ...] [--target T] --out DIR --study FILE "
            "[--max-load L] [--settle S] [--allow-noisy]: run the study and gather it; commands [--epochs "
            "E] --out DIR: print its runs; report NETWORK=DIR ... [--target T] --study FILE: gather "
            "finished runs. 'SUBCOMMAND --help' for each.")


def main(argv=None):
    """``run`` the study, print its ``commands``, or ``report`` finished runs; return the exit status."""
    p, parsers = study.subcommands("python -m experiments.cluster.compression", __doc__.split("\n")[0], _EPILOG,
                                   "results/cluster/compression", "results/cluster/compression_study.json")
    parsers["report"].add_argument("sweeps", type=text(), nargs="+", help="NETWORK=DIR: a compression_sweep --out directory")
    for name in ("run", "commands"):
        parsers[name].add_argument("--epochs", type=integer(1, INT32_MAX), default=3, help="epochs per training run (default 3)")
        parsers[name].add_argument("--seeds", type=text(), default="0", help="training seeds, comma separated (default 0)")
        parsers[name].add_argument("--compressor", type=text(), action="append", default=[], metavar="SPEC", help="a compressor "
                                   "spec, repeatable (default: the compression study's list)")
    for name in ("run", "report"):
        parsers[name].add_argument("--target", type=real(0, 1e15, low_open=True), default=0.94, help="test accuracy of the time to "
                                   "accuracy (default 0.94)")
    a = p.parse_args(argv)
    if a.what != "commands" and not 0 < a.target < 1:
        p.error(f"--target must be a fraction between 0 and 1, not {a.target}")
    if a.what == "commands":
        print("\n".join(commands(a.out, a.epochs, a.seeds, compressors=a.compressor)))
        return 0
    if a.what == "run":
        settings = {"nodes": 4, "ranks_per_node": 1, "epochs": a.epochs, "seeds": a.seeds}
        dirs = {net: os.path.join(a.out, net) for net in NETWORKS}
        status = study.run_study(a, commands(a.out, a.epochs, a.seeds, harness.load_flags(a, 5), a.compressor),
                                 lambda: gather(dirs, a.target, settings), P=5, label="compression study", show=compression_markdown)
        return status
    dirs = {}
    for item in a.sweeps:
        net, _, path = item.partition("=")
        if not path or not os.path.isfile(os.path.join(path, "compression_sweep.json")):
            p.error(f"{item}: expected NETWORK=DIR, DIR holding a compression_sweep.json")
        dirs[net] = path
    record = gather(dirs, a.target)
    study.write_record(record, a.study, compression_markdown)
    print(f"wrote {a.study}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
