"""Draw the model-parallel study: per grid, step time against data-parallel, bytes per rank per step
on each axis, memory per rank; per schedule, the measured pipeline bubble against the formula and the
activation memory each stage holds.

    python -m plots.model_parallel results/model_parallel.json [--out FILE.png]
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

from plots.inputs import read_results  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402
from training.settings.options import Parser, infile, outpath

__all__ = ["draw", "main"]

AXES = (("data", "tab:blue"), ("tensor", "tab:orange"), ("pipeline", "tab:green"))


def _label(g):
    return f"{g['D']}x{g['T']}x{g['Q']}"


def _errbar(ax, xs, stats, **kw):
    med = [s["median"] for s in stats]
    lo = [s["median"] - s["min"] for s in stats]
    hi = [s["max"] - s["median"] for s in stats]
    return ax.bar(xs, med, yerr=[lo, hi], capsize=3, **kw)


def _blank(ax, text):
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def draw(results, out):
    """Draw the six panels of ``results`` (the study's JSON) into ``out`` (PNG); return ``out``.

    Top row, per grid: step time against data-parallel, bytes per rank per step on each axis,
    parameters + Adam state per rank. Bottom row: the pipeline bubble against micro-batches, the
    activation memory per stage, the step time in seconds.
    """
    grids, bubble = results["grids"], results["bubble"]
    xs, labels = list(range(len(grids))), [_label(g) for g in grids]
    fig, axs = plt.subplots(2, 3, figsize=(16, 9))
    _step_ratio_panel(axs[0, 0], grids, xs, labels)
    _bytes_panel(axs[0, 1], grids, xs, labels)
    _memory_panel(axs[0, 2], grids, xs, labels)
    _bubble_panel(axs[1, 0], bubble)
    _activation_panel(axs[1, 1], bubble)
    _step_time_panel(axs[1, 2], grids, xs, labels)
    cfg, run = results["config"], results["run"]
    fig.suptitle(f"MLP {cfg['features']}-{'-'.join(map(str, cfg['hidden']))}-10, float32, global batch "
                 f"{cfg['batch']}, P = {run.get('P')}, {run.get('mpi_library', '')[:40]}, host {run.get('host', '')}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _step_ratio_panel(ax, grids, xs, labels):
    _errbar(ax, xs, [g["step_ratio_to_dp"] for g in grids], color="tab:gray")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xticks=xs, xticklabels=labels, ylabel="step time / data-parallel step time",
           title="step time (median, range over rounds)", xlabel="grid D x T x Q (data x tensor x pipeline)")


def _bytes_panel(ax, grids, xs, labels):
    bottom = [0.0] * len(grids)
    for name, color in AXES:
        v = [g["bytes_per_rank_per_step"][name] / 1e6 for g in grids]
        ax.bar(xs, v, bottom=bottom, color=color, label=name)
        bottom = [b + x for b, x in zip(bottom, v)]
    ax.set(xticks=xs, xticklabels=labels, ylabel="MB sent per rank per step", title="communication per axis",
           xlabel="grid D x T x Q")
    ax.legend()


def _memory_panel(ax, grids, xs, labels):
    dp = grids[0]["max_state_bytes"] / 1e6
    ax.bar(xs, [g["max_state_bytes"] / 1e6 for g in grids], color="tab:purple", label="measured (most loaded rank)")
    ax.plot(xs, [dp / (g["T"] * g["Q"]) for g in grids], "k_", ms=30, mew=2, label="data-parallel / (T x Q)")
    ax.set(xticks=xs, xticklabels=labels, ylabel="MB per rank", title="parameters + Adam state per rank",
           xlabel="grid D x T x Q")
    ax.legend()


def _bubble_panel(ax, bubble):
    for sched, color in (("gpipe", "tab:red"), ("1f1b", "tab:blue")):
        rows = [b for b in bubble if b["schedule"] == sched]
        m = [b["micro_batches"] for b in rows]
        med = [b["bubble"]["median"] for b in rows]
        err = [[b["bubble"]["median"] - b["bubble"]["min"] for b in rows],
               [b["bubble"]["max"] - b["bubble"]["median"] for b in rows]]
        ax.errorbar(m, med, yerr=err, marker="o", capsize=3, color=color, label=f"{sched} measured")
    if bubble:
        m = sorted({b["micro_batches"] for b in bubble})
        Q = bubble[0]["Q"]
        ax.plot(m, [(Q - 1) / (k + Q - 1) for k in m], "k--", label="(Q-1)/(m+Q-1)")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(title=f"pipeline bubble, Q = {Q} stages", xticks=m, xticklabels=[str(k) for k in m])
    ax.set(xlabel="micro-batches m", ylabel="fraction of the pipeline phase spent waiting", ylim=(0, 1))
    if bubble:
        ax.legend()
    else:
        _blank(ax, "pipeline bubble: not measured in this run")


def _activation_panel(ax, bubble):
    if bubble:
        top = max(b["micro_batches"] for b in bubble)
        for k, (sched, color) in enumerate((("gpipe", "tab:red"), ("1f1b", "tab:blue"))):
            row = next(b for b in bubble if b["schedule"] == sched and b["micro_batches"] == top)
            stages = list(range(len(row["activation_bytes"])))
            ax.bar([s + (k - 0.5) * 0.4 for s in stages], [a / 1e6 for a in row["activation_bytes"]], width=0.4,
                   color=color, label=sched)
        ax.set(xticks=stages, xlabel="stage", title=f"activation memory per stage, m = {top}")
        ax.legend()
    else:
        _blank(ax, "activation memory: not measured in this run")
    ax.set(ylabel="MB of activation buffers held")


def _step_time_panel(ax, grids, xs, labels):
    _errbar(ax, xs, [dict(g["step_s"]) for g in grids], color="tab:olive")
    ax.set(xticks=xs, xticklabels=labels, ylabel="seconds", title="step time (median, range)",
           xlabel="grid D x T x Q")


def main(argv=None):
    p = Parser(prog="python -m plots.model_parallel",
                                description="Draw the model-parallel study (results JSON -> PNG).")
    p.add_argument("results", type=infile(), help="results file of experiments.studies.model_parallel_study")
    p.add_argument("--out", type=outpath(empty=True), help="PNG to write (default: beside the results, .png)")
    args = p.parse_args(argv)
    results = read_results(p, args.results)
    out = args.out or os.path.splitext(args.results)[0] + ".png"
    try:
        print(draw(results, out))
    except (KeyError, TypeError, IndexError, AttributeError) as exc:
        p.error(f"{args.results}: not a results file of experiments.studies.model_parallel_study (missing {exc!r})")
    except OSError as exc:
        p.error(f"--out {out}: {exc.strerror or exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
