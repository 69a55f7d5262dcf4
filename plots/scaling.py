"""Draw predicted all-reduce time against P, one panel per message size, from ``experiments.studies.scale_sim``.

Run: ``python -m plots.scaling results/scale_sim.json [--out results/scaling.png]``.
"""
import math

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from commlab.byte_sizes import format_bytes  # noqa: E402
from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["main", "draw"]


def _crossover_note(cross):
    """Two short lines naming, per algorithm, the smallest P from which it beats the ring."""
    items = [f"{a.replace('recursive_doubling', 'rec. doubling')} " + (f"P={p}" if p else "never")
             for a, p in cross.items()]
    if not items:
        return ""
    half = (len(items) + 1) // 2
    rest = "\n" + ", ".join(items[half:]) if items[half:] else ""
    return "faster than ring from: " + ", ".join(items[:half]) + rest


def draw(result, out):
    """Write the figure for a ``scale_sim`` result dict to ``out`` (PNG path).

    One panel per message size: predicted time (ms, log scale, plain-number ticks) against P (log2
    axis labelled with the rank counts themselves); each panel's title names the size and, on two
    lines, the smallest P from which each algorithm beats the ring; one legend below the panels.
    """
    rows = result["rows"]
    sizes = sorted({r["bytes"] for r in rows})
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    topo = result["topology"]
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.4 * len(sizes), 4.9), squeeze=False,
                             constrained_layout=True)
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("v", ":"), ("D", "-")]
    ps = sorted({r["P"] for r in rows})
    for ax, size in zip(axes[0], sizes):
        for i, alg in enumerate(algs):
            pts = sorted((r["P"], r["time_s"]) for r in rows if r["bytes"] == size and r["algorithm"] == alg)
            marker, line = styles[i % len(styles)]
            ax.plot([p for p, _ in pts], [t * 1e3 for _, t in pts], marker=marker, ls=line, ms=4,
                    color=f"C{i % 10}", label=alg)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ps)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.0f}"))
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.tick_params(axis="x", labelsize=7.5, labelrotation=45)
        times = [r["time_s"] * 1e3 for r in rows if r["bytes"] == size]
        decades = math.log10(max(times) / min(times)) if times and min(times) > 0 else 3
        subs = (1.0,) if decades >= 2.5 else (1.0, 2.0, 5.0)  # every panel gets several plain labels
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=subs))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("ranks P")
        ax.set_ylabel("predicted time (ms, log scale)")
        note = _crossover_note(result.get("crossovers", {}).get(str(size), {}))
        title = f"all-reduce {format_bytes(size)}"
        ax.set_title(title + (f"\n{note}" if note else ""), fontsize=8.5)
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", axis="y", alpha=0.12)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8.5)
    fig.suptitle(f"simulated all-reduce time on a two-level topology: {topo['ranks_per_node']} ranks/node, "
                 f"intra {topo['alpha_intra'] * 1e6:g} us + {1 / topo['beta_intra'] / 1e9:g} GB/s, "
                 f"inter {topo['alpha_inter'] * 1e6:g} us + {1 / topo['beta_inter'] / 1e9:g} GB/s", fontsize=10)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    """Read the results JSON and write the PNG."""
    ap = Parser(prog="python -m plots.scaling", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=infile(), help="JSON written by experiments.studies.scale_sim")
    ap.add_argument("--out", type=outpath(), default="results/scaling.png", help="PNG path (default results/scaling.png)")
    args = ap.parse_args(argv)
    results = read_results(ap, args.results)
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        ap.error(f"{args.results}: not an experiments.studies.scale_sim results file (no list of rows)")
    try:
        draw(results, args.out)
    except (KeyError, TypeError) as exc:
        ap.error(f"{args.results}: not an experiments.studies.scale_sim results file ({exc!r})")
    except OSError as exc:
        ap.error(f"cannot write --out {args.out!r}: {exc.strerror or exc}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
