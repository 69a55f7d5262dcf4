"""Draw the compression study: test accuracy against payload bytes per step (log scale), and the
training loss curves.

    python -m plots.compression results/compression/compression_sweep.json [--out FILE.png]
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.text import Text  # noqa: E402

__all__ = ["draw", "main"]

_MARKERS = {"none": "*", "fp16": "o", "int8": "o", "qsgd": "o", "terngrad": "D", "signsgd": "^",
            "efsignsgd": "^", "onebit": "^", "topk": "s", "randomk": "s", "threshold": "s",
            "dgc": "P", "powersgd": "X"}
_SPAN = 5.0  # accuracy points shown below none; lower results sit on the floor, labelled


def _place_labels(ax, labels):
    """Annotate points without overlap: try offsets above and below until the label is free."""
    ax.set_xlim(ax.get_xlim())  # settle the autoscaled limits before measuring
    renderer = ax.figure.canvas.get_renderer()
    placed = []  # display boxes of the labels already drawn
    for x, y, text in labels:
        for dy in (8, -16, 20, -28, 32, -40, 44, -52, 56, -64):
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, dy), ha="center",
                              fontsize=7.5, color="0.15",
                              arrowprops={"arrowstyle": "-", "color": "0.6", "lw": 0.6}
                              if abs(dy) > 16 else None)
            box = Text.get_window_extent(ann, renderer).expanded(1.04, 1.15)  # the text, no arrow
            if not any(box.overlaps(b) for b in placed):
                break
            ann.remove()
        else:
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(0, 8), ha="center",
                        fontsize=7.5, color="0.15")
        placed.append(box)


def draw(results, path):
    """Draw the two panels of ``results`` (the sweep's JSON, as a dict) into the PNG ``path``.

    Parameters
    ----------
    results : dict
        As written by ``experiments.compression_sweep`` (``table``, ``run``, ``train_config``).
    path : str
        Output PNG file.

    Raises
    ------
    ValueError
        If ``results`` has no table rows.
    """
    rows = results.get("table") or []
    if not rows:
        raise ValueError("results: the table is empty (was the sweep run?)")
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(16, 6.5), width_ratios=[1.5, 1])
    colors = plt.get_cmap("tab20")
    none = next((r for r in rows if r["spec"] == "none"), None)
    accs = [100 * r["test_acc_mean"] for r in rows]
    top = max(100 * r["test_acc_max"] for r in rows) + 0.6
    floor = (100 * none["test_acc_mean"] - _SPAN) if none is not None else min(accs) - 1
    floor = max(floor, min(accs) - 1)
    order = sorted(range(len(rows)), key=lambda i: rows[i]["bytes_per_step"])
    labels = []
    for k, i in enumerate(order):
        r, color, acc = rows[i], colors(i % 20), accs[i]
        marker = _MARKERS.get(r["compressor"], "o")
        label = r["spec"]
        if acc < floor:  # far below the others: drawn on the floor, value in the label
            label = f"{r['spec']} ({acc:.1f}%)"
            ax_acc.plot(r["bytes_per_step"], floor + 0.15, marker="v", color=color, markersize=9)
        else:
            err = [[acc - 100 * r["test_acc_min"]], [100 * r["test_acc_max"] - acc]]
            ax_acc.errorbar(r["bytes_per_step"], acc, yerr=err, fmt=marker, color=color,
                            markersize=10 if r["spec"] == "none" else 7, capsize=3)
        labels.append((r["bytes_per_step"], max(acc, floor + 0.15), label))
        epochs = range(1, len(r["loss_curve"]) + 1)
        ax_loss.plot(epochs, r["loss_curve"], color=color, marker=marker, markersize=3,
                     linewidth=2.2 if r["spec"] == "none" else 1.3, label=r["spec"])
    if none is not None:
        ref = 100 * none["test_acc_mean"]
        ax_acc.axhline(ref, color="0.5", linestyle="--", linewidth=1)
        ax_acc.axhspan(ref - 1.5, ref, color="0.92", zorder=0)
        ax_acc.text(0.01, ref - 1.45, "within 1.5 points of none", fontsize=7, color="0.4",
                    va="bottom", transform=ax_acc.get_yaxis_transform())
    ax_acc.set_ylim(floor, top)
    run, cfg = results.get("run", {}), results.get("train_config", {})
    seeds = rows[0].get("seeds", 1)
    ax_acc.set_xscale("log")
    ax_acc.set_xlabel("payload bytes sent per rank per step (log scale)")
    ax_acc.set_ylabel(f"final test accuracy (%), mean of {seeds} seed(s), bars: min-max")
    ax_acc.set_title("accuracy against bytes on the wire")
    ax_acc.grid(True, which="both", alpha=0.3)
    ax_acc.margins(x=0.08)
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training loss (mean over ranks and seeds, log scale)")
    ax_loss.set_title("loss curves")
    ax_loss.grid(True, which="both", alpha=0.3)
    ax_loss.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.suptitle(f"gradient compression on {cfg.get('data', '?')}: {results.get('parameters', '?')} "
                 f"parameters, P={run.get('P', '?')}, {cfg.get('optimizer', '?')} lr {cfg.get('lr', '?')}, "
                 f"batch {cfg.get('batch_size', '?')}, {cfg.get('epochs', '?')} epochs "
                 f"({' '.join(run.get('mpi_library', '').split())[:40]}, {run.get('host', '')})", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    _place_labels(ax_acc, labels)  # after the layout: it measures the labels on the canvas
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main(argv=None):
    """Command-line entry point; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m plots.compression",
                                description="Draw the compression study from its results JSON.")
    p.add_argument("results", help="compression_sweep.json written by experiments.compression_sweep")
    p.add_argument("--out", help="output PNG (default: compression.png beside RESULTS)")
    args = p.parse_args(argv)
    try:
        with open(args.results, encoding="utf-8") as f:
            results = json.load(f)
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.results)), "compression.png")
        draw(results, out)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
