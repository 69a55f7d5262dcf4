"""Draw the heterogeneity study: step time over the ideal step per condition, one bar group per method
(median, range over repeats); and its table (step, efficiency, speedup, time to target, accuracy).

    python -m plots.hetero results/hetero/hetero_w2_dp.json results/hetero/hetero_w2_ps.json [--out FILE.png]

The data-parallel and parameter-server launches of one worker count are drawn and tabulated together;
the ideal step and the speedups come from the data-parallel launch's ``equal`` runs
(:mod:`experiments.studies.hetero_study`).
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from tabulate import tabulate  # noqa: E402

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["rows", "draw", "markdown", "main"]


def rows(results):
    """Return (conditions in order, {method: {condition: row}}) of one or several results files.

    Examples
    --------
    >>> row = {"method": "balance", "condition": "slow2", "step_s": 0.30, "step_s_min": 0.29, "step_s_max": 0.32,
    ...        "efficiency": 0.92, "efficiency_min": 0.9, "efficiency_max": 0.95, "speedup": 1.4, "speedup_min": 1.3,
    ...        "speedup_max": 1.45, "accuracy": 0.95, "accuracy_min": 0.94, "accuracy_max": 0.96,
    ...        "time_to_target_s": 1.2, "time_to_target_s_min": 1.1, "time_to_target_s_max": 1.3, "runs": 3,
    ...        "reached_target": 3}
    >>> res = {"workers": 2, "conditions": ["slow2"], "table": [row], "train_config": {"batch_size": 512}}
    >>> print(markdown(res).splitlines()[2])
    | balance  | slow2       | 300.0 (290.0-320.0) | 0.92 (0.90-0.95) |   1.40 (1.30-1.45) | 1.20 (1.10-1.30) | 95.0 (94.0-96.0) |
    """
    conditions, methods = [], {}
    for res in ([results] if isinstance(results, dict) else results):
        for c in res["conditions"]:
            if c not in conditions:
                conditions.append(c)
        for row in res["table"]:
            methods.setdefault(row["method"], {})[row["condition"]] = row
    return conditions, methods


def _cell(row, key, scale=1.0, fmt="{:.2f}"):
    v = row.get(key)
    if v is None:
        return "never" if key == "time_to_target_s" else ""
    lo, hi = row.get(key + "_min"), row.get(key + "_max")
    return f"{fmt.format(v * scale)} ({fmt.format(lo * scale)}-{fmt.format(hi * scale)})"


def markdown(results):
    """Return the study's table (Markdown): one row per (method, condition), median (range) over repeats."""
    conditions, methods = rows(results)
    cells = []
    for method, by in methods.items():
        for c in conditions:
            if c in by:
                r = by[c]
                cells.append([method, c, _cell(r, "step_s", 1e3, "{:.1f}"), _cell(r, "efficiency"), _cell(r, "speedup"),
                              _cell(r, "time_to_target_s"), _cell(r, "accuracy", 100, "{:.1f}")])
    return tabulate(cells, ["method", "condition", "step ms", "ideal / step", "speedup vs equal", "to target s",
                            "accuracy %"], tablefmt="pipe", disable_numparse=True,
                    colalign=("left", "left", *["right"] * 5))


def draw(results, out):
    """Draw each method's ideal / step (efficiency) per condition into ``out`` (PNG); return ``out``."""
    conditions, methods = rows(results)
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(methods))
    for k, (method, by) in enumerate(methods.items()):
        xs = [i + k * width for i, c in enumerate(conditions) if by.get(c, {}).get("efficiency") is not None]
        rs = [by[c] for c in conditions if by.get(c, {}).get("efficiency") is not None]
        mid = [r["efficiency"] for r in rs]
        err = [[m - r["efficiency_min"] for m, r in zip(mid, rs)], [r["efficiency_max"] - m for m, r in zip(mid, rs)]]
        ax.bar(xs, mid, width, yerr=err, label=method, capsize=2)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(conditions))], conditions)
    ax.set_ylabel("ideal step / step (median, range)")
    top = max((r.get("efficiency_max") or 0 for by in methods.values() for r in by.values()), default=0)
    ax.set_ylim(0, max(1.1, 1.05 * top))  # above 1: the host ran faster than in the repeat's even run
    ax.legend(fontsize=8, ncol=len(methods))
    first = results if isinstance(results, dict) else results[0]
    where = (first.get("provenance") or {}).get("emulated")  # the emulator's command, up to its --
    if where:
        words = where.split()
        per, link = (words[words.index(k) + 1] if k in words else "?" for k in ("--ranks-per-node", "--link"))
        where = f"\non the emulated cluster: {per} rank(s) per node, {link} links"
    ax.set_title("Unequal workers: step time against the ideal (global batch / summed speeds)" + (where or ""),
                 fontsize=10 if where else None)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None):
    p = Parser(prog="python -m plots.hetero", description="Draw the heterogeneity study (results -> PNG).")
    p.add_argument("results", type=infile(), nargs="+", help="results files of experiments.studies.hetero_study")
    p.add_argument("--out", type=outpath(empty=True), help="PNG to write (default: hetero.png beside the first results file)")
    args = p.parse_args(argv)
    results = [read_results(p, path) for path in args.results]
    out = args.out or os.path.join(os.path.dirname(args.results[0]), "hetero.png")
    try:
        print(markdown(results))
        print(draw(results, out))
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        p.error(f"not a results file of experiments.studies.hetero_study (missing {exc!r})")
    except OSError as exc:
        p.error(f"--out {out}: {exc.strerror or exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
