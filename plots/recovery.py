"""Draw the elastic recovery study (``experiments.studies.elastic_recovery``): recovery against a restart.

    python -m plots.recovery results/elastic.json [--out FILE.png]

One panel per study file: for every kill (x: the kill's number, in the study's order), the seconds
from the death to the survivors' next completed step under ``--elastic`` and to the restarted job's
first completed step after ``--resume`` from the last checkpoint (log scale), with the targets
(elastic median 1 s, worst 3 s) as lines. :func:`markdown` renders the study's table. Drawing only:
every number comes from the study's file.
"""
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from plots.inputs import read_results  # noqa: E402
from training.settings.options import Parser, infile, outpath  # noqa: E402

__all__ = ["draw", "markdown", "main"]


def _series(study):
    """Return ``(elastic seconds, restart seconds)`` per kill (None where one was not measured)."""
    return ([k["elastic"].get("next_step_s") for k in study["kills"]],
            [k["restart"].get("restart_s") for k in study["kills"]])


def draw(study, out):
    """Draw ``study`` (the JSON of ``experiments.studies.elastic_recovery``) to the PNG ``out``; return ``out``."""
    el, rs = _series(study)
    x = list(range(1, len(el) + 1))
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.plot([i for i, v in zip(x, rs) if v is not None], [v for v in rs if v is not None], "s", color="tab:red",
            label="restart from the last checkpoint (--resume): death to first step")
    ax.plot([i for i, v in zip(x, el) if v is not None], [v for v in el if v is not None], "o", color="tab:blue",
            label="--elastic: death to the survivors' next step")
    ax.axhline(1.0, color="tab:blue", ls="--", lw=1, label="target: elastic median <= 1 s")
    ax.axhline(3.0, color="tab:blue", ls=":", lw=1, label="target: elastic worst <= 3 s")
    ax.set_yscale("log")
    ax.set_xlabel("kill (a random rank, step and moment each)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("seconds from the death")
    s = study["settings"]
    ax.set_title(f"P = {s['ranks']}: {len(el)} kills, elastic median {study['elastic_next_step_median_s']:.3g} s, "
                 f"restart median {study['restart_median_s']:.3g} s ({study['speedup_median']:.0f}x)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(study):
    """Return the study's table as Markdown: the targets' figures, one row per measure."""
    from tabulate import tabulate

    el, rs = _series(study)
    el = [v for v in el if v is not None]
    rs = [v for v in rs if v is not None]
    redone_e = [k["elastic"].get("steps_redone") for k in study["kills"] if k["elastic"].get("steps_redone") is not None]
    redone_r = [k["restart"].get("steps_redone") for k in study["kills"] if k["restart"].get("steps_redone") is not None]
    s = study["settings"]
    cells = [["seconds from the death to the next completed step, median (range)",
              f"{statistics.median(el):.3g} ({min(el):.3g}-{max(el):.3g})" if el else "-",
              f"{statistics.median(rs):.3g} ({min(rs):.3g}-{max(rs):.3g})" if rs else "-"],
             ["steps done again, median (range)",
              f"{statistics.median(redone_e):g} ({min(redone_e)}-{max(redone_e)})" if redone_e else "-",
              f"{statistics.median(redone_r):g} ({min(redone_r)}-{max(redone_r)})" if redone_r else "-"],
             ["hangs", str(sum(k["elastic"]["hang"] for k in study["kills"])),
              str(sum(k["restart"]["hang"] for k in study["kills"]))],
             ["jobs that did not finish with identical replicas", str(study["elastic_not_finished_or_diverged"]), "-"]]
    head = (f"P = {s['ranks']}, {len(study['kills'])} kills (seed {s['seed']}), {s['epochs']} epochs of "
            f"{s['samples']} synthetic samples: elastic recovery {study['speedup_median']:.0f}x faster than a "
            f"restart (medians); the study's limits (elastic median <= 1 s and worst <= 3 s, at least 10x "
            f"faster, no hang, identical replicas) {'all hold' if study['targets_met'] else 'do not all hold'}.")
    return head + "\n\n" + tabulate(cells, headers=("", "--elastic", "restart (--resume)"), tablefmt="pipe",
                                    disable_numparse=True)


def main(argv=None):
    """Draw the figure of a study file; return the exit status."""
    p = Parser(prog="python -m plots.recovery", description=__doc__.split("\n\n")[0])
    p.add_argument("study", type=infile(), help="results JSON of experiments.studies.elastic_recovery")
    p.add_argument("--out", type=outpath(empty=True), default="", help="PNG to write (default: beside the study, .png)")
    a = p.parse_args(argv)
    study = read_results(p, a.study)
    out = a.out or a.study.rsplit(".", 1)[0] + ".png"
    print(f"wrote {draw(study, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
