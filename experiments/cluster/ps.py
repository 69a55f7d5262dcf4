"""Parameter server against all-reduce on emulated 1 Gbit/s links: samples/s and bytes per link per step.

Run the whole study as one command (same data, global batch and epochs; 4 workers, one node per rank,
servers on nodes of their own; a small model whose gradient's time on the wire is short against a step,
and a large one whose gradient takes longer on the wire than a step computes; the load average checked
before the first run and recorded while they run, :mod:`experiments.cluster.study`)::

    python -m experiments.cluster.ps run --epochs 3 --repeats 2 --hidden 512 --hidden 1024,1024 \\
        --out results/cluster/ps --study results/cluster/ps_study.json
    python -m plots.cluster results/cluster/ps_study.json

Each run is one ``python -m training.emulator.emulate --nodes 4+S --ranks-per-node 1 --link 1gbit --
python -m training.train ...`` writing ``DIR/hWIDTHS/NAME/summary.json`` (``dp-ring-rR`` and
``ps-bsp-sS-rR`` for S = 1, 2, 4 and repeats R, the repeats interleaved); ``commands`` prints them and
``report DIR --hidden ...`` gathers finished runs.

Bytes per link per step follow from the protocols, for n parameters of 4 bytes and W workers, each
direction of a node's link: ring all-reduce (Patarasuk and Yuan 2009) sends 2 (W - 1) / W x 4n on
every link; BSP with S servers (M. Li et al., "Scaling Distributed Machine Learning with the
Parameter Server", OSDI 2014, section 3) sends 4n on a worker's link (push out, pull in) and
W x 4n / S on a server's (every worker's shard), so the server links carry W / S times a worker's:
the concentration BytePS (Y. Jiang et al., OSDI 2020, section 3) removes by adding servers. The
data-parallel run's own byte counter (``bytes_sent_per_rank``) checks the ring figure. Samples/s is
training throughput without evaluation: the parameter server's own (samples over the servers' job
time; it evaluates snapshots afterwards), and for data parallelism the global batch over the median
step time (:func:`training.predict.validate.epoch_times`, evaluation excluded); median and
range over the repeats.
"""
import glob
import json
import os
import re
import sys
from statistics import median

from experiments.cluster import study
from training.emulator.net import parse_rate
from plots.tables.cluster_tables import ps_markdown
from training.settings.options import INT32_MAX, infile, integer, text
from training.predict.validate import epoch_times

__all__ = ["commands", "link_bytes", "report", "gather", "main"]

SERVERS = (1, 2, 4)
HIDDEN = ("512", "1024,1024")  # 38,410 and 1,126,410 parameters on digits (154 KB and 4.5 MB of gradient)


def _model(hidden):
    """The run folder of a model: ``h`` and its widths joined by ``x``."""
    return "h" + hidden.replace(",", "x")


def commands(out, epochs=3, repeats=2, hidden=HIDDEN, link="1gbit"):
    """Return the study's runs (shell lines), the repeats interleaved.

    Examples
    --------
    >>> cmds = commands("results/cluster/ps", repeats=1, hidden=("512",))
    >>> len(cmds), "--nodes 8" in cmds[-1] and "--servers 4" in cmds[-1]
    (4, True)
    """
    out_cmds = []
    for r in range(1, repeats + 1):
        for h in hidden:
            train = (f"python -m training.train --epochs {epochs} --hidden {h} --run-dir {out}/{_model(h)} "
                     "--no-progress")
            out_cmds.append(f"python -m training.emulator.emulate --nodes 4 --ranks-per-node 1 --link {link} -- "
                            f"{train} --algorithm ring --name dp-ring-r{r}")
            out_cmds += [f"python -m training.emulator.emulate --nodes {4 + s} --ranks-per-node 1 --link {link} -- "
                         f"{train} --mode ps --servers {s} --consistency bsp --name ps-bsp-s{s}-r{r}" for s in SERVERS]
    return out_cmds


def link_bytes(kind, n, workers, servers=0, itemsize=4):
    """Return ``(busiest link, worker link)`` bytes per step in each direction.

    Parameters
    ----------
    kind : {"dp", "ps"}
        Ring all-reduce data parallelism or the BSP parameter server.
    n : int
        Parameters.
    workers, servers : int
        W worker ranks and S server ranks (one per node).
    itemsize : int
        Bytes per parameter.
    """
    if kind == "dp":
        b = 2 * (workers - 1) / workers * n * itemsize
        return b, b
    return max(n * itemsize, workers * n * itemsize / servers), n * itemsize


def report(root, link="1gbit"):
    """Return one row per configuration from the run directories under ``root`` (one model's), with the
    busiest link's time on the wire per step at the ``link`` rate (``wire_ms``) and, for the ring, the
    computation's time per step (``compute_ms``: the trainer's own timer, rank 0, median of the repeats)."""
    groups = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "summary.json"))):
        m = re.fullmatch(r"(dp-ring|ps-bsp-s(\d+))-r\d+", os.path.basename(os.path.dirname(path)))
        if not m:
            continue
        with open(path, encoding="utf-8") as f:
            groups.setdefault(m.group(1), []).append(json.load(f))
    rows = []
    for name, runs in sorted(groups.items(), key=lambda kv: (kv[0] != "dp-ring", kv[0])):
        s0 = runs[0]
        if name == "dp-ring":
            with open(os.path.join(s0["run_dir"], "config.json"), encoding="utf-8") as f:
                batch = json.load(f).get("config", {}).get("batch_size", 64)
            rates = [batch / median(step for step, _, _ in epoch_times(r["run_dir"])) for r in runs]
            workers, servers, kind = s0["P"], 0, "dp"
            measured = median(r["bytes_sent_per_rank"] / r["steps"] for r in runs)
        else:
            rates = [r["samples_per_s"] for r in runs]
            workers, servers, kind = s0["workers"], s0["servers"], "ps"
            measured = None
        compute = [r["compute_s"] / r["steps"] * 1e3 for r in runs if r.get("compute_s") and r.get("steps")]
        busiest, worker = link_bytes(kind, s0["parameters"], workers, servers)
        rows.append({"config": name, "nodes": workers + servers, "workers": workers, "servers": servers,
                     "samples_per_s": median(rates), "samples_min": min(rates), "samples_max": max(rates),
                     "repeats": len(runs), "final_test_acc": median(r["final_test_acc"] for r in runs),
                     "busiest_link_bytes": busiest, "worker_link_bytes": worker,
                     "measured_sent_per_rank_step": measured, "parameters": s0["parameters"],
                     "wire_ms": busiest * 8 / parse_rate(link) * 1e3,
                     "compute_ms": median(compute) if compute else None})
    base = next((r for r in rows if r["config"] == "dp-ring"), None)
    for r in rows:
        r["vs_allreduce"] = r["samples_per_s"] / base["samples_per_s"] if base else None
    return rows


def gather(out, hidden=HIDDEN, link="1gbit", settings=None):
    """Return the study's record from the runs under ``OUT/hWIDTHS`` (keys ``study``, ``link``, ``models``:
    ``{name: {"hidden", "parameters"}}``, ``settings``, ``rows``: :func:`report`'s, each with its ``model``)."""
    rows, models = [], {}
    for h in hidden:
        mine = report(os.path.join(out, _model(h)), link)
        if not mine:
            raise ValueError(f"no dp-ring-rR or ps-bsp-sS-rR runs with a summary.json under {out}/{_model(h)}")
        models[_model(h)] = {"hidden": h, "parameters": mine[0]["parameters"]}
        rows += [{"model": _model(h), **r} for r in mine]
    return {"study": "experiments.cluster.ps", "link": link, "models": models, "settings": settings, "rows": rows}


#: The top-level help's summary of the subcommands.
_EPILOG = ("run [--epochs E] [--repeats R] [--hidden W,W ...] --out DIR --study FILE [--max-load L] "
            "[--settle S] [--allow-noisy]: run the study and gather it; commands [--epochs E] [--repeats "
            "R] [--hidden W,W ...] --out DIR: print its runs; report DIR [--hidden W,W ...] --study FILE: "
            "gather finished runs. 'SUBCOMMAND --help' for each.")


def main(argv=None):
    """``run`` the study, print its ``commands``, or ``report`` finished runs; return the exit status."""
    p, parsers = study.subcommands("python -m experiments.cluster.ps", __doc__.split("\n")[0], _EPILOG,
                                   "results/cluster/ps", "results/cluster/ps_study.json")
    parsers["report"].add_argument("root", type=infile(), help="the runs' directory (hWIDTHS/dp-ring-rR, hWIDTHS/ps-bsp-sS-rR)")
    for name, q in parsers.items():
        q.add_argument("--hidden", type=text(), action="append", metavar="W[,W...]", help="a model's hidden widths, repeatable "
                       f"(default: {' and '.join(HIDDEN)})")
        if name != "report":
            q.add_argument("--epochs", type=integer(1, INT32_MAX), default=3, help="epochs per training run (default 3)")
            q.add_argument("--repeats", type=integer(1, INT32_MAX), default=2, help="runs per configuration (default 2)")
    a = p.parse_args(argv)
    hidden = tuple(a.hidden or HIDDEN)
    bad = [h for h in hidden if not re.fullmatch(r"\d+(,\d+)*", h)]
    if bad:
        p.error(f"--hidden takes widths separated by commas, not {bad[0]!r}")
    if a.what != "report" and (a.epochs < 1 or a.repeats < 1):
        p.error("--epochs and --repeats must be at least 1")
    if a.what == "commands":
        print("\n".join(commands(a.out, a.epochs, a.repeats, hidden)))
        return 0
    if a.what == "run":
        settings = {"workers": 4, "servers": list(SERVERS), "epochs": a.epochs, "repeats": a.repeats}
        status = study.run_study(a, commands(a.out, a.epochs, a.repeats, hidden),
                                 lambda: gather(a.out, hidden, settings=settings), P=4 + max(SERVERS) + 1,
                                 label="ps study", show=ps_markdown)
        return status
    try:
        record = gather(a.root, hidden)
    except (OSError, ValueError) as e:
        p.error(str(e))
    study.write_record(record, a.study, ps_markdown)
    print(f"wrote {a.study}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
