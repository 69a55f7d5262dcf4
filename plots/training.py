"""Draw a training run: ``python -m plots.training runs/NAME [runs/OTHER ...]``.

Writes two PNG files (into the first run's directory unless ``--out`` is given):

``training_curves.png``
    Training loss and train/test accuracy against epoch and against wall time (seconds); several
    runs are overlaid for comparison.
``training_time.png``
    Per epoch, a stacked bar of compute seconds and communication seconds per rank, one panel
    per run.

``runs/latest`` (a link or a text file holding a run path, as ``training.train`` writes it) is
accepted wherever a run directory is.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["resolve_run", "load_run", "plot_curves", "plot_time", "main"]


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


def load_run(path):
    """Return ``(label, epochs, summary)`` of a run: its name, per-epoch records and summary."""
    run = resolve_run(path)
    with open(os.path.join(run, "epochs.jsonl"), encoding="utf-8") as f:
        epochs = [json.loads(line) for line in f if line.strip()]
    summary = {}
    if os.path.exists(os.path.join(run, "summary.json")):
        with open(os.path.join(run, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
    return os.path.basename(run), epochs, summary


def _series(epochs, key):
    xs = [r["epoch"] for r in epochs if r.get(key) is not None]
    return xs, [r[key] for r in epochs if r.get(key) is not None]


def plot_curves(runs, path):
    """Draw loss and accuracy against epoch and wall time for ``runs`` into PNG ``path``.

    Parameters
    ----------
    runs : list of (str, list of dict, dict)
        As returned by :func:`load_run`.
    path : str
    """
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), constrained_layout=True)
    for i, (label, epochs, _) in enumerate(runs):
        color = f"C{i % 10}"
        wall = {r["epoch"]: r.get("wall_s") for r in epochs}
        for col, xkey in enumerate(("epoch", "wall_s")):
            def x_of(es):
                return es if xkey == "epoch" else [wall[e] for e in es]
            es, loss = _series(epochs, "loss")
            if loss:
                axes[0, col].plot(x_of(es), loss, color=color, marker=".", label=label)
            for key, style in (("train_acc", "--"), ("test_acc", "-")):
                es, acc = _series(epochs, key)
                if acc and (xkey == "epoch" or all(wall[e] is not None for e in es)):
                    axes[1, col].plot(x_of(es), [100 * a for a in acc], style, color=color,
                                      marker=".", label=f"{label} {key.split('_')[0]}")
    for col, xlabel in enumerate(("epoch", "wall time (s)")):
        axes[0, col].set(xlabel=xlabel, ylabel="training loss (cross-entropy)", yscale="log",
                         title=f"loss vs {xlabel.split(' (')[0]}")
        axes[1, col].set(xlabel=xlabel, ylabel="accuracy (%)",
                         title=f"accuracy vs {xlabel.split(' (')[0]} (dashed: train, solid: test)")
        lows = [100 * r["test_acc"] for _, es, _ in runs for r in es if r.get("test_acc") is not None]
        if lows:
            axes[1, col].set_ylim(max(0, min(sorted(lows)[len(lows) // 4], 90) - 2), 100.5)
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[1, 0].legend(fontsize=8, loc="lower right")
    if len(runs) > 1:
        axes[0, 0].legend(fontsize=8)
    fig.suptitle("training: " + ", ".join(label for label, _, _ in runs), fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time(runs, path):
    """Draw, per run, a stacked bar per epoch of compute and communication seconds into ``path``."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), squeeze=False,
                             constrained_layout=True)
    for ax, (label, epochs, summary) in zip(axes[:, 0], runs):
        rows = [r for r in epochs if r.get("compute_s") is not None and r.get("comm_s") is not None]
        es = [r["epoch"] for r in rows]
        comp = [r["compute_s"] for r in rows]
        comm = [r["comm_s"] for r in rows]
        ax.bar(es, comp, color="C0", label="compute (forward, backward, optimizer)")
        ax.bar(es, comm, bottom=comp, color="C3", label="communication (gradient all-reduce)")
        frac = summary.get("comm_fraction")
        note = f" | communication {frac:.0%} of step time" if frac is not None else ""
        ax.set(xlabel="epoch", ylabel="seconds per rank", title=f"{label}{note}")
        ax.grid(axis="y", alpha=0.3)
        if not rows:
            ax.text(0.5, 0.5, "no compute/communication timing in this run", ha="center",
                    transform=ax.transAxes)
        ax.legend(fontsize=8, loc="upper right")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Command-line entry point: draw the PNGs and print their paths."""
    p = argparse.ArgumentParser(prog="python -m plots.training",
                                description="Draw loss/accuracy curves and the compute/communication "
                                            "time split of training runs as PNG files.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directory (runs/NAME) or runs/latest; several are overlaid")
    p.add_argument("--out", default=None,
                   help="directory for the PNG files (default: the first run's directory)")
    args = p.parse_args(argv)
    try:
        runs = [load_run(r) for r in args.runs]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    out = args.out or resolve_run(args.runs[0])
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "training_curves.png"), os.path.join(out, "training_time.png")]
    plot_curves(runs, paths[0])
    plot_time(runs, paths[1])
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
