"""Draw a training run: ``python -m plots.training runs/NAME [runs/OTHER ...]``.

Writes two PNG files (into the first run's directory unless ``--out`` is given):

``training_curves.png``
    Training loss and train/test accuracy against epoch and against wall time (seconds); several
    runs are overlaid for comparison.
``training_time.png``
    One panel per run. Data-parallel: per epoch, a stacked bar of the compute, gradient
    transfer and waiting-for-the-slowest-rank seconds. Parameter server: per worker, the run's
    compute, injected delay and time waiting on the servers.

``runs/latest`` (a link or a text file holding a run path, as ``training.train`` writes it) is
accepted wherever a run directory is.
"""
import textwrap
import json
import os
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["resolve_run", "load_run", "describe", "plot_curves", "plot_time", "main"]


def resolve_run(path):
    """Return the run directory that ``path`` names (a directory, or a file holding its path).

    Raises
    ------
    FileNotFoundError
        When ``path`` leads to no directory with an ``epochs.jsonl``.
    """
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            target = f.read().strip()
        path = target if os.path.isabs(target) else os.path.join(os.path.dirname(path), target)
    if not os.path.isfile(os.path.join(path, "epochs.jsonl")):
        raise FileNotFoundError(f"{path}: not a training run directory (no epochs.jsonl)")
    return os.path.realpath(path)


def _read_json(path):
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_run(path):
    """Return ``(label, epochs, summary)`` of a run: its name, per-epoch records and summary.

    The summary dict gets the run's ``config.json`` (resolved configuration and MPI library) under
    the key ``"_config"`` when the run has one.
    """
    run = resolve_run(path)
    with open(os.path.join(run, "epochs.jsonl"), encoding="utf-8") as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    summary = _read_json(os.path.join(run, "summary.json"))
    summary["_config"] = _read_json(os.path.join(run, "config.json"))
    return os.path.basename(run), epochs, summary


def describe(summary):
    """Return a one-line description of a run for titles: mode, algorithm or consistency, P, MPI
    library and dtype, e.g. ``data-parallel, algorithm auto, P=4, MPICH 5.0.2, float32``."""
    saved = summary.get("_config", {})
    cfg, run = saved.get("config", {}), saved.get("run", {})
    parts = []
    if cfg.get("mode") == "ps" or summary.get("mode") == "ps":
        c = cfg.get("consistency", summary.get("consistency", "?"))
        bound = f" s={cfg.get('staleness')}" if c == "ssp" else ""
        servers = cfg.get("servers", summary.get("servers", "?"))
        parts.append(f"parameter server {c.upper()}{bound}, {servers} server(s)")
    elif _grid(cfg):
        T, Q = _grid(cfg)
        P = run.get("P", summary.get("P"))
        D = P // (T * Q) if isinstance(P, int) and P % (T * Q) == 0 else "?"
        pipe = f", {cfg.get('schedule', '?')} with {cfg.get('micro_batches', '?')} micro-batches" if Q > 1 else ""
        parts.append(f"data x tensor x pipeline {D}x{T}x{Q}{pipe}, algorithm " + cfg.get("algorithm", "?"))
    elif cfg:
        parts.append("data-parallel, algorithm " + cfg.get("algorithm", "?")
                     + (f", {cfg['compression']}" if cfg.get("compression", "none") != "none" else ""))
    P = run.get("P", summary.get("P"))
    if P is not None:
        parts.append(f"P={P}")
    if run.get("mpi_library"):  # formatted when the run was written (commlab.provenance.mpi_library)
        parts.append(run["mpi_library"])
    if cfg.get("dtype"):
        parts.append(cfg["dtype"])
    if cfg.get("data"):
        hidden = "-".join(str(h) for h in cfg.get("hidden", []))
        parts.append(f"{cfg['data']}, MLP hidden {hidden or 'none'}")
    return ", ".join(parts)


def _grid(cfg):
    """Return (tensor, pipeline) degrees of a model-parallel run's configuration, else None."""
    T, Q = int(cfg.get("tensor_parallel") or 1), int(cfg.get("pipeline_parallel") or 1)
    return (T, Q) if T * Q > 1 else None


def _series(epochs, key):
    xs = [r["epoch"] for r in epochs if r.get(key) is not None]
    return xs, [r[key] for r in epochs if r.get(key) is not None]


def plot_curves(runs, path):
    """Draw loss and accuracy against epoch and wall time for ``runs`` into PNG ``path``.

    The title names each run's mode, algorithm (or consistency model), P, MPI library and dtype;
    the accuracy axis spans every plotted value; the legend sits below the panels, off the data.

    Parameters
    ----------
    runs : list of (str, list of dict, dict)
        As returned by :func:`load_run`.
    path : str
        Output PNG file.
    """
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    accs = []
    for i, (label, epochs, _) in enumerate(runs):
        color = f"C{i % 10}"
        wall = {r["epoch"]: r.get("wall_s") for r in epochs}
        name = f"{label}: " if len(runs) > 1 else ""
        for col, xkey in enumerate(("epoch", "wall_s")):
            def x_of(es):
                return es if xkey == "epoch" else [wall[e] for e in es]
            es, loss = _series(epochs, "loss")
            if loss and (xkey == "epoch" or all(wall[e] is not None for e in es)):
                axes[0, col].plot(x_of(es), loss, color=color, marker=".", label=f"{name}training loss")
            for key, style in (("train_acc", "--"), ("test_acc", "-")):
                es, acc = _series(epochs, key)
                if acc and (xkey == "epoch" or all(wall[e] is not None for e in es)):
                    accs += [100 * a for a in acc]
                    axes[1, col].plot(x_of(es), [100 * a for a in acc], style, color=color, marker=".",
                                      label=f"{name}{key.split('_')[0]} accuracy" if col == 0 else None)
    for col, xlabel in enumerate(("epoch", "wall time since start (s)")):
        axes[0, col].set(xlabel=xlabel, ylabel="training loss (cross-entropy, log scale)", yscale="log",
                         title=f"loss vs {xlabel.split(' (')[0].replace(' since start', '')}")
        axes[1, col].set(xlabel=xlabel, ylabel="accuracy (%)",
                         title=f"accuracy vs {xlabel.split(' (')[0].replace(' since start', '')}")
        if accs:  # every point visible: the axis starts below the lowest value plotted
            axes[1, col].set_ylim(max(0.0, 5 * ((min(accs) - 1) // 5)), 100.5)
        loss_ax = axes[0, col]  # plain-number ticks at 1, 2, 5 x 10^k, none on minor ticks
        loss_ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        loss_ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        loss_ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            if col == 0:  # epochs are whole numbers
                ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    handles, labels = axes[1, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(4, max(1, len(labels))), fontsize=8)
    finals = [f"final test {100 * s['final_test_acc']:.2f}%" for _, _, s in runs if "final_test_acc" in s]
    head = "; ".join(describe(s) or label for label, _, s in runs)
    title = f"training: {head}" + (f" ({', '.join(finals)})" if len(runs) == 1 and finals else "")
    fig.suptitle(textwrap.fill(title, 130), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_dp_time(ax, epochs, summary):
    rows = [r for r in epochs if r.get("compute_s") is not None and r.get("comm_s") is not None]
    es = [r["epoch"] for r in rows]
    comp = [r["compute_s"] for r in rows]
    grid = _grid(summary.get("_config", {}).get("config", {}))
    if rows and all(r.get("wait_s") is not None and r.get("transfer_s") is not None for r in rows):
        wait = [r["wait_s"] for r in rows]
        transfer = [r["transfer_s"] for r in rows]
        ax.bar(es, comp, color="C0", label="compute (forward, backward, optimizer)")
        ax.bar(es, transfer, bottom=comp, color="C3",
               label="transfer (data-parallel all-reduce, tensor-parallel messages)" if grid
               else "transfer (gradient all-reduce)")
        ax.bar(es, wait, bottom=[c + t for c, t in zip(comp, transfer)], color="C7",
               label="wait for pipeline neighbours (bubble)" if grid else "wait for the slowest rank (skew)")
    else:
        ax.bar(es, comp, color="C0", label="compute (forward, backward, optimizer)")
        ax.bar(es, [r["comm_s"] for r in rows], bottom=comp, color="C3",
               label="communication (gradient all-reduce, including waits)")
    frac = summary.get("comm_fraction")
    note = f"; communication {frac:.0%} of step time" if frac is not None else ""
    ax.set(xlabel="epoch", ylabel="seconds per epoch (mean over ranks)",
           title=f"compute and communication per epoch{note}")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if not rows:
        ax.text(0.5, 0.5, "no compute/communication timing in this run", ha="center", transform=ax.transAxes)


def _plot_ps_time(ax, summary):
    """Per worker: compute, injected delay (straggler, jitter), waiting on the servers, the rest."""
    stats = sorted((w for w in summary.get("worker_stats") or [] if w), key=lambda w: w["worker"])
    if not stats:
        ax.text(0.5, 0.5, "no worker statistics in this run", ha="center", transform=ax.transAxes)
        return
    servers = summary.get("servers", 0)
    names = [f"worker {w['worker']} (rank {servers + w['worker']})" for w in stats]
    left = [0.0] * len(stats)
    parts = (("compute_s", "C0", "compute (forward, backward)"),
             ("delay_s", "C1", "injected delay (--straggler, --jitter)"),
             ("wait_s", "C3", "push and pull: waiting for the servers"))
    for key, color, label in parts:
        vals = [float(w.get(key) or 0.0) for w in stats]
        ax.barh(names, vals, left=left, color=color, label=label)
        left = [a + v for a, v in zip(left, vals)]
    wall = summary.get("wall_s")
    if wall:
        ax.axvline(wall, color="k", ls="--", lw=1, label=f"job wall time {wall:.2f} s")
    ax.invert_yaxis()
    ups = summary.get("updates_per_s")
    ax.set(xlabel="seconds over the whole run", title="where each worker's time went"
           + (f" ({ups:.0f} updates/s at the servers)" if ups else ""))


def plot_time(runs, path):
    """Draw each run's time split into PNG ``path``, one panel per run.

    Data-parallel runs: a stacked bar per epoch of compute, gradient transfer and waiting for the
    slowest rank (seconds, means over ranks). Parameter-server runs (``mode == "ps"``): per worker,
    the whole run's compute, injected delay and time waiting on the servers' push/pull answers.
    """
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.6 * len(runs)), squeeze=False,
                             constrained_layout=True)
    for ax, (label, epochs, summary) in zip(axes[:, 0], runs):
        if summary.get("mode") == "ps":
            _plot_ps_time(ax, summary)
        else:
            _plot_dp_time(ax, epochs, summary)
        ax.grid(axis="x" if summary.get("mode") == "ps" else "y", alpha=0.3)
        if summary.get("mode") != "ps":  # headroom above the bars for the legend inside the axes
            ax.set_ylim(top=ax.get_ylim()[1] * 1.35)
        ax.legend(fontsize=8, loc="upper right", ncol=3, framealpha=0.9)
        ax.set_title(f"{textwrap.fill(describe(summary) or label, 110)}\n{ax.get_title()}", fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point: draw the PNGs and print their paths."""
    p = Parser(prog="python -m plots.training",
                                description="Draw loss/accuracy curves and the compute/communication "
                                            "time split of training runs as PNG files.")
    p.add_argument("runs", type=infile(folder=None), nargs="+", metavar="RUN",
                   help="run directory (runs/NAME) or runs/latest; several are overlaid")
    p.add_argument("--out", type=outpath(folder=True, empty=True), default=None,
                   help="directory for the PNG files (default: the first run's directory)")
    args = p.parse_args(argv)
    try:
        runs = [load_run(r) for r in args.runs]
    except (OSError, ValueError) as e:
        p.error(str(e))
    out = args.out or resolve_run(args.runs[0])
    paths = [os.path.join(out, "training_curves.png"), os.path.join(out, "training_time.png")]
    try:
        os.makedirs(out, exist_ok=True)
        plot_curves(runs, paths[0])
        plot_time(runs, paths[1])
    except OSError as e:
        p.error(f"--out {out}: cannot write there ({e.strerror or e})")
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
