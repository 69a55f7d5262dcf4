"""Draw the emulated-cluster collectives study: time, speedup over the flat ring, inter-node link use.

    python -m plots.cluster results/cluster/collectives.json [--out FILE.png]

One row of panels per link rate: all-reduce time per call against size (log-log), each algorithm's
speedup over ``ring`` (median of the passes, bars: their range; above 1 is faster than the flat
ring), and the inter-node busbw as a fraction of the configured link rate. Drawing only: every
number comes from ``experiments.cluster_collectives``.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

__all__ = ["draw", "main"]

_STYLE = {"ring": ("tab:blue", "o"), "rabenseifner": ("tab:orange", "s"), "2d": ("tab:green", "^"),
          "tree": ("tab:red", "v"), "mpi": ("black", "x")}


def _size_label(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def draw(study, out):
    """Draw ``study`` (the JSON of ``experiments.cluster_collectives``) to the PNG ``out``."""
    rows = study["rows"]
    links = list(dict.fromkeys(r["link"] for r in rows))
    fig, axes = plt.subplots(len(links), 3, figsize=(15, 4.2 * len(links)), squeeze=False)
    for ax_row, link in zip(axes, links):
        s = study["summary"][link]
        mine = [r for r in rows if r["link"] == link]
        algs = [a for a in _STYLE if any(r["algorithm"] == a for r in mine)]
        sizes = sorted({r["bytes"] for r in mine})
        for a in algs:
            rs = sorted((r for r in mine if r["algorithm"] == a), key=lambda r: r["bytes"])
            color, marker = _STYLE[a]
            x = [r["bytes"] for r in rs]
            ax_row[0].plot(x, [r["time_s"] * 1e3 for r in rs], marker=marker, color=color, label=a)
            sp = [r for r in rs if r["speedup_vs_ring"] is not None]
            if a != "ring" and sp:
                y = [r["speedup_vs_ring"] for r in sp]
                err = [[r["speedup_vs_ring"] - r["speedup_min"] for r in sp],
                       [r["speedup_max"] - r["speedup_vs_ring"] for r in sp]]
                ax_row[1].errorbar([r["bytes"] for r in sp], y, yerr=err, marker=marker, color=color, label=a,
                                   capsize=3)
            ut = [r for r in rs if r["utilization"] is not None]
            if ut:
                ax_row[2].plot([r["bytes"] for r in ut], [r["utilization"] for r in ut], marker=marker, color=color,
                               label=a)
        title = f"{link} links, P = {s['P']} ({s['P'] // s['ranks_per_node']} nodes x {s['ranks_per_node']})"
        ax_row[0].set(xscale="log", yscale="log", ylabel="time per all-reduce (ms)", title=title)
        ax_row[1].axhline(1.0, color="tab:blue", lw=1, ls="--")
        ax_row[1].set(xscale="log", ylabel="speedup over ring (x)", title=f"{link}: time(ring) / time(alg)")
        ax_row[2].axhline(1.0, color="grey", lw=1, ls=":")
        ax_row[2].set(xscale="log", ylim=(0, 1.1), ylabel="inter-node busbw / link rate",
                      title=f"{link}: bytes leaving the busiest node / time")
        for ax in ax_row:
            ax.set_xticks(sizes[::2])
            ax.set_xticklabels([_size_label(b) for b in sizes[::2]], rotation=30)
            ax.set_xlabel("all-reduce size")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle("All-reduce across emulated nodes (experiments.cluster): flat ring vs hierarchical 2d")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Read the study's JSON and write the PNG; return the exit status."""
    p = argparse.ArgumentParser(prog="python -m plots.cluster", description=__doc__.split("\n")[0])
    p.add_argument("study", help="results/cluster/collectives.json from experiments.cluster_collectives")
    p.add_argument("--out", default="", help="PNG path (default: beside the JSON, .png)")
    a = p.parse_args(argv)
    with open(a.study, encoding="utf-8") as f:
        study = json.load(f)
    out = a.out or os.path.splitext(a.study)[0] + ".png"
    draw(study, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
