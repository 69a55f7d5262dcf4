"""Draw the at-scale answer of ``experiments.predict.scale``: best and second-best step time against P.

Run: ``python -m plots.predict results/predict/scale.json [--out results/predict/scale.png]``.
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["draw", "main"]


def draw(result, out):
    """Write one panel per cluster to ``out``: the best and second-best predicted step time (ms, log
    scale) against P (log2 axis), each point labelled with its configuration."""
    best = result["best"]
    clusters = list(dict.fromkeys(b["cluster"] for b in best))
    fig, axes = plt.subplots(1, len(clusters), figsize=(5.6 * len(clusters), 4.6), squeeze=False,
                             constrained_layout=True)
    for ax, name in zip(axes[0], clusters):
        pts = sorted((b for b in best if b["cluster"] == name), key=lambda b: b["P"])
        ps = [b["P"] for b in pts]
        ax.plot(ps, [b["best_s"] * 1e3 for b in pts], "o-", label="best")
        ax.plot(ps, [b["second_s"] * 1e3 for b in pts], "s--", label="second best")
        for b in pts:
            ax.annotate(b["best"], (b["P"], b["best_s"] * 1e3), textcoords="offset points", xytext=(0, -12),
                        ha="center", fontsize=6)
            ax.annotate(b["second"], (b["P"], b["second_s"] * 1e3), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=6, color="C1")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_xlabel("ranks P")
        ax.set_ylabel("predicted step time (ms)")
        ax.set_title(name)
        ax.legend(fontsize=8)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m plots.predict", description=__doc__.split("\n")[0])
    p.add_argument("result", help="OUT.json of experiments.predict.scale")
    p.add_argument("--out", default="", help="PNG path (default: the result's path with .png)")
    a = p.parse_args(argv)
    with open(a.result, encoding="utf-8") as f:
        result = json.load(f)
    out = a.out or a.result.rsplit(".", 1)[0] + ".png"
    draw(result, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
