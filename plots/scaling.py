"""Draw predicted all-reduce time against P, one panel per message size, from ``experiments.scale_sim``.

Run: ``python -m plots.scaling results/scale_sim.json [--out results/scaling.png]``.
"""
import argparse
import json

import humanfriendly
import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["main", "draw"]


def draw(result, out):
    """Write the figure for a ``scale_sim`` result dict to ``out`` (PNG path)."""
    rows = result["rows"]
    sizes = sorted({r["bytes"] for r in rows})
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    topo = result["topology"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.2 * len(sizes), 4.4), squeeze=False)
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("v", ":"), ("D", "-")]
    for ax, size in zip(axes[0], sizes):
        for i, alg in enumerate(algs):
            pts = sorted((r["P"], r["time_s"]) for r in rows if r["bytes"] == size and r["algorithm"] == alg)
            marker, line = styles[i % len(styles)]
            ax.plot([p for p, _ in pts], [t * 1e3 for _, t in pts], marker=marker, ls=line, ms=4, label=alg)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks P")
        ax.set_ylabel("predicted time (ms)")
        cross = result.get("crossovers", {}).get(str(size), {})
        note = ", ".join(f"{a.replace('recursive_doubling', 'rec.doubling')} from P={p}" if p else f"{a} never"
                         for a, p in cross.items())
        note = f"faster than ring: {note}" if note else ""
        title = f"all-reduce {humanfriendly.format_size(size, binary=True)}"  # training.sizes' formatter
        ax.set_title(title + (f"\n{note}" if note else ""), fontsize=8.5)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"simulated two-level topology: {topo['ranks_per_node']} ranks/node, "
                 f"intra {topo['alpha_intra'] * 1e6:g} us + {1 / topo['beta_intra'] / 1e9:g} GB/s, "
                 f"inter {topo['alpha_inter'] * 1e6:g} us + {1 / topo['beta_inter'] / 1e9:g} GB/s", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Read the results JSON and write the PNG."""
    ap = argparse.ArgumentParser(prog="python -m plots.scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="JSON written by experiments.scale_sim")
    ap.add_argument("--out", default="results/scaling.png", help="PNG path (default results/scaling.png)")
    args = ap.parse_args(argv)
    try:
        with open(args.results, encoding="utf-8") as f:
            results = json.load(f)
    except OSError as exc:
        ap.error(f"{args.results}: {exc.strerror or exc}")
    except ValueError as exc:
        ap.error(f"{args.results}: not JSON ({exc})")
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        ap.error(f"{args.results}: not an experiments.scale_sim results file (no list of rows)")
    try:
        draw(results, args.out)
    except (KeyError, TypeError) as exc:
        ap.error(f"{args.results}: not an experiments.scale_sim results file ({exc!r})")
    except OSError as exc:
        ap.error(f"cannot write --out {args.out!r}: {exc.strerror or exc}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
