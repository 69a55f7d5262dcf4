"""Draw the elastic recovery study (``experiments.studies.elastic_recovery``): recovery against a restart.

    python -m plots.recovery results/elastic.json [--out FILE.png]

One panel per study file: for every kill (x: the kill's number, in the study's order), the seconds
from the death to the survivors' next completed step under ``--elastic``, to the restarted job's
first completed step after ``--resume`` from the last checkpoint and, when the study ran with
``--respawn``, back to P ranks under ``--elastic-respawn`` (log scale), with the targets (elastic
median 1 s, worst 3 s) as lines. :func:`markdown` renders the study's table. Drawing only:
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
    """Return ``(elastic seconds, restart seconds, respawn seconds)`` per kill (None where one was not measured)."""
    return ([k["elastic"].get("next_step_s") for k in study["kills"]],
            [k["restart"].get("restart_s") for k in study["kills"]],
            [k.get("respawn", {}).get("back_to_P_s") for k in study["kills"]])


def _where(s):
    """The study's machine in words: ``P = 4`` or ``2 nodes x 2 ranks, 1gbit links (P = 4)``."""
    if s.get("cluster"):
        return f"{s['cluster'][0]} nodes x {s['cluster'][1]} ranks, {s['link']} links (P = {s['ranks']})"
    return f"P = {s['ranks']}"


def draw(study, out):
    """Draw ``study`` (the JSON of ``experiments.studies.elastic_recovery``) to the PNG ``out``; return ``out``."""
    el, rs, sp = _series(study)
    x = list(range(1, len(el) + 1))
    s = study["settings"]
    fig, ax = plt.subplots(figsize=(9, 5.4))
    ax.plot([i for i, v in zip(x, rs) if v is not None], [v for v in rs if v is not None], "s", color="tab:red",
            label="restart from the last checkpoint (--resume): death to first step")
    per = (s.get("cluster") or [0, 0])[1]
    node = [len(k["elastic"].get("victims", [0])) == per for k in study["kills"]]  # a whole node died
    for whole, marker, what in ((False, "o", ""), (True, "D", ", a whole node died")):
        pts = [(i, v) for i, v, n in zip(x, el, node) if v is not None and n == whole]
        if pts:
            ax.plot(*zip(*pts), marker, color="tab:blue", label=f"--elastic: death to the survivors' next step{what}")
    if any(v is not None for v in sp):
        ax.plot([i for i, v in zip(x, sp) if v is not None], [v for v in sp if v is not None], "^", color="tab:green",
                label="--elastic-respawn: death back to P ranks")
    ax.axhline(1.0, color="tab:blue", ls="--", lw=1, label="target: elastic median <= 1 s")
    ax.axhline(3.0, color="tab:blue", ls=":", lw=1, label="target: elastic worst <= 3 s")
    ax.set_yscale("log")
    ax.set_xlabel("kill (a random rank, step and moment each)" if not s.get("cluster") else
                  "kill (a random rank or node, step and moment each)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("seconds from the death")
    ax.set_title(f"{_where(s)}: {len(el)} kills, elastic median {study['elastic_next_step_median_s']:.3g} s, "
                 f"restart median {study['restart_median_s']:.3g} s ({study['speedup_median']:.0f}x)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def markdown(study):
    """Return the study's table as Markdown: the targets' figures, one row per measure."""
    from tabulate import tabulate

    el, rs, sp = _series(study)
    el = [v for v in el if v is not None]
    rs = [v for v in rs if v is not None]
    sp = [v for v in sp if v is not None]
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
    if "respawn_back_to_P_median_s" in study:
        cells += [["with --elastic-respawn: seconds from the death back to P ranks, median (range)",
                   f"{statistics.median(sp):.3g} ({min(sp):.3g}-{max(sp):.3g})" if sp else "-", "-"],
                  ["with --elastic-respawn: jobs not back at P ranks with identical replicas, or hung",
                   str(study["respawn_not_back_to_P_or_diverged"]
                       + sum(k["respawn"]["hang"] for k in study["kills"])), "-"]]
    respawned = ("; every --elastic-respawn job back at P ranks with identical replicas"
                 if "respawn_back_to_P_median_s" in study else "")
    nodes = sum(len(k["elastic"].get("victims", [0])) == (s.get("cluster") or [0, 0])[1] for k in study["kills"])
    head = (f"{_where(s)}, {len(study['kills'])} kills (seed {s['seed']}"
            f"{f'; {nodes} of them a whole node' if s.get('cluster') else ''}), {s['epochs']} epochs of "
            f"{s['samples']} synthetic samples: elastic recovery {study['speedup_median']:.0f}x faster than a "
            f"restart (medians); the study's limits (elastic median <= 1 s and worst <= 3 s, at least 10x "
            f"faster, no hang, identical replicas{respawned}) {'all hold' if study['targets_met'] else 'do not all hold'}.")
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
