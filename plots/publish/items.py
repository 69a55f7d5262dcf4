"""The published items: each reference result file under ``plots/reference/``, the table it renders
into the documents' marked blocks and the figures it draws (:data:`ITEMS`, read by
:mod:`plots.publish.documents`), with the renderers of single studies.

A renderer takes its reference file's path under ``plots/reference/`` and returns Markdown, or the
paths of the figures it drew into ``plots/figures/``; a study whose ``plots`` module renders its own
table and figure is named through :func:`_module_table` and :func:`_figure`. Every renderer loads its
file, refuses one measured on a busy machine and ends its table with the file's provenance
(:mod:`plots.publish.sources`).
"""
import glob
import json
import os

from plots.publish.sources import FIGURES, REFERENCE, check_quiet, load as _load, source_line

__all__ = ["ITEMS", "figure_names"]


def _bench(rel):
    from plots.bench import markdown

    results = _load(rel)
    prov = check_quiet(results, rel)
    return markdown(results, "median") + "\n\n" + source_line(prov, rel)


def _bench_figures(rel):
    from plots.bench import draw

    results = _load(rel)
    check_quiet(results, rel)
    return draw(results, FIGURES, True, "median", 64 * 1024)


def _run_provenance(rel):
    """Return the provenance of a reference training run folder (its ``config.json`` and ``summary.json``)."""
    import shlex

    from commlab.provenance import default_max_load, is_quiet

    folder = os.path.join(REFERENCE, rel)
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        run = json.load(f)["run"]
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    if "load_average" not in run or "load_average_end" not in summary:
        return check_quiet({}, rel)
    before, end, limit = run["load_average"], summary["load_average_end"], default_max_load(run["cores"])
    prov = {"command": shlex.join(["mpiexec", "-n", str(run["P"]), "python", "-m", "training.train", *run["argv"]]),
            "versions": {"python": run["python"], "numpy": run["numpy"], "mpi4py": run["mpi4py"],
                         "mpi_library": run["mpi_library"]},
            "P": run["P"], "cores": run["cores"], "date": run["started"], "max_load": limit,
            "load": {"before": before, "during_max": max(before, end)},
            "noisy": not is_quiet(before, end, run["P"], limit)}
    return check_quiet({"provenance": prov}, rel)


def _training_table(rel):
    from tabulate import tabulate

    from plots.training import load_run

    prov = _run_provenance(rel)
    _, epochs, summary = load_run(os.path.join(REFERENCE, rel))
    shown = [e for e in epochs if e["epoch"] in (1, 2, 5) or e["epoch"] % 10 == 0 or e is epochs[-1]]
    cells = [[e["epoch"], f"{e['loss']:.4f}", f"{100 * e['train_acc']:.2f} %", f"{100 * e['test_acc']:.2f} %",
              f"{1000 * e['compute_s']:.1f}", f"{1000 * e['wait_s']:.1f}", f"{1000 * e['transfer_s']:.1f}"]
             for e in shown]
    table = tabulate(cells, headers=("epoch", "loss", "train accuracy", "test accuracy", "compute (ms)",
                                     "wait (ms)", "transfer (ms)"), tablefmt="pipe", disable_numparse=True,
                     colalign=("right",) * 7)
    head = (f"Test accuracy **{100 * summary['final_test_acc']:.2f} %** after {summary['epochs']} epochs "
            f"({summary['steps']} steps, {summary['wall_s']:.2f} s); communication "
            f"{100 * summary['comm_fraction']:.0f} % of step time; {summary['bytes_sent_per_rank'] / 2 ** 20:.1f} MiB "
            f"sent per rank; replicas bitwise identical: {'yes' if summary['replicas_identical'] else 'NO'}.")
    return head + "\n\n" + table + "\n\n" + source_line(prov, rel)


def _training_figures(rel):
    from plots.training import load_run, plot_curves, plot_time

    _run_provenance(rel)
    run = load_run(os.path.join(REFERENCE, rel))
    curves, times = os.path.join(FIGURES, "training_curves.png"), os.path.join(FIGURES, "training_time.png")
    plot_curves([run], curves)
    plot_time([run], times)
    return [curves, times]


def _scaling_table(rel):
    from tabulate import tabulate

    from commlab.byte_sizes import format_bytes

    result = _load(rel)
    prov = check_quiet(result, rel)
    algs = [a for a in next(iter(result["crossovers"].values()))]
    cells = [[format_bytes(int(size))] + [("never" if cross.get(a) is None else str(cross[a])) for a in algs]
             for size, cross in result["crossovers"].items()]
    table = tabulate(cells, headers=["message"] + algs,
                     tablefmt="pipe", disable_numparse=True, colalign=["left"] + ["right"] * len(algs))
    return table + "\n\n" + source_line(prov, rel)



def _trainer_table(rel):
    from plots.tables.study_tables import trainer_table

    results = _load(rel)
    prov = check_quiet(results, rel)
    model = "-".join(map(str, results["model"]))
    head = (f"MLP {model}, float32, one thread: forward, softmax cross-entropy, backward and optimizer step; "
            f"median (min-max) of {results['repeats']} alternating repeats; PyTorch {results['torch']}.")
    return head + "\n\n" + trainer_table(results["cells"]) + "\n\n" + source_line(prov, rel)


def _small_calls(rel):
    from plots.bench import small_calls_table

    results = _load(rel)
    prov = check_quiet(results, rel)
    return small_calls_table(results) + "\n\n" + source_line(prov, rel)


def _mpi_baseline_table(rel):
    from tabulate import tabulate

    r = _load(rel)
    prov = check_quiet(r, rel)

    def size(n):
        return f"{n / 2 ** 20:g} MiB" if n >= 2 ** 20 else f"{n / 1024:g} KiB"

    rows = [[size(e["bytes"]), f"{e['ratio_median']:.2f}x ({e['ratio_min']:.2f}-{e['ratio_max']:.2f})",
             f"{e['mpi_default_ratio']:.2f}x" if e["mpi_default_ratio"] else "-", e["commlab_best"], e["mpi_best"]]
            for e in r["sizes"]]
    table = tabulate(rows, ["size", "best-of-MPI time / commlab's best", "default MPI_Allreduce / commlab's best",
                            "commlab's best", "MPI's best"], tablefmt="pipe", disable_numparse=True,
                     colalign=("right", "right", "right", "left", "left"))
    g, (lo, hi) = r["geomean"], r["range_bytes"]
    head = (f"P = {r['P']}, float32 sum, median (min-max) over {r['rounds']} rounds of launches; above 1 commlab's "
            f"best algorithm is faster. Geometric mean over {size(lo)}-{size(hi)}: "
            f"{g['median']:.2f}x ({g['min']:.2f}-{g['max']:.2f}).")
    return head + "\n\n" + table + "\n\n" + source_line(prov, rel, True)


def _serving_load_table(rel):
    from plots.serving import load_table

    doc = _load(rel)
    prov = check_quiet(doc, rel)
    reps = doc["study"]["repeats"]
    return (f"Medians over {reps} repeats; p50 / p99 in ms; goodput: answers within the objective per second.\n\n"
            + load_table(doc["points"]) + "\n\n" + source_line(prov, rel))


def _serving_load_figure(rel):
    from plots.serving import draw_load

    doc = _load(rel)
    check_quiet(doc, rel)
    out = os.path.join(FIGURES, "serving_load.png")
    draw_load(doc, out)
    return [out]


def _replicas_table(rel):
    from tabulate import tabulate

    r = _load(rel)
    prov = check_quiet(r, rel)
    st, cost, ratio = r["settings"], r["cost"], r["ratio_R2_over_R1"]
    recov = [c["recovery_s"] for c in r["crashes"] if c.get("recovery_s") is not None]
    early = sum(s < st["ps_timeout"] for s in recov)
    crashes = tabulate([[st["crashes"], r["lost_acknowledged"], f"{r['bitwise_equal']} of {st['crashes']}",
                         f"{r['recovery_median_s']:.3f} s", f"{min(recov):.3f} s" if recov else "-", f"{r['recovery_max_s']:.3f} s",
                         f"{early} of {len(recov)}", f"{r['recovery_bound_s']:g} s"]],
                       ["crashes of a primary", "acknowledged clocks lost", "final parameters bitwise equal",
                        "crash to next update (median)", "(min)", "(max)", "(below --ps-timeout)",
                        "bound (--ps-timeout + 1 s)"],
                       tablefmt="pipe", disable_numparse=True)
    rows = [[f"R = {k[1]}", f"{cost[k]['samples_per_s']:.0f}", f"{cost[k]['bytes_per_clock'] / 1024:.1f}"] for k in ("R1", "R2")]
    rows.append(["R = 2 / R = 1", f"{ratio['samples_per_s']:.2f}x", f"{ratio['bytes_per_clock']:.2f}x"])
    costs = tabulate(rows, ["fault-free, median of " + str(st["repeats"]), "samples / s", "payload KiB / clock"],
                     tablefmt="pipe", disable_numparse=True, colalign=("left", "right", "right"))
    deaths = sorted({c["death"] for c in r["crashes"] if c.get("death")})  # as the dying rank printed it
    how = f"; the primary died by {' and '.join(deaths)}" if deaths else ""
    accs = [x["test_acc"] for k in ("R1", "R2") for x in cost[k]["runs"]] + [c["test_acc"] for c in r["crashes"]
                                                                         if c.get("test_acc") is not None]
    acc = (f"test accuracy {accs[0]:.2%} in every run" if len(set(accs)) == 1 else
           f"test accuracy {min(accs):.2%}-{max(accs):.2%}")
    return (f"{st['workers']} workers, digits MLP 64-{st['hidden']}-10, SGD with momentum 0.9 and lr {st['lr']:g}, "
            f"{st['epochs']} epochs, --ps-timeout {st['ps_timeout']:g} s{how}; {acc}.\n\n" + crashes + "\n\n"
            + costs + "\n\n" + source_line(prov, rel, True))


def _metrics_overhead_table(rel):
    import statistics

    from tabulate import tabulate

    def share(values):
        return f"{100 * statistics.median(values):.2f} %" if values else ""

    r = _load(rel)
    prov = check_quiet(r, rel)
    off = r["step_s"]["off"]
    rows = [["off", f"{1e3 * statistics.median(off):.3f} ({1e3 * min(off):.3f}-{1e3 * max(off):.3f})", "", "", "", ""]]
    for arm, label in (("watch", "--monitor"), ("serve", "--metrics-port (scraped)")):
        a, t = r[arm], r["step_s"][arm]
        rows.append([label, f"{1e3 * statistics.median(t):.3f} ({1e3 * min(t):.3f}-{1e3 * max(t):.3f})",
                     f"{a['ratio_median']:.3f} ({a['ratio_min']:.3f}-{a['ratio_max']:.3f})",
                     share(a["monitor_overhead"]), share([v[0] for v in a.get("monitor_overhead_ranks", [])]),
                     share(a.get("export_overhead", []))])
    verdicts = [f"{label} {'within' if statistics.median(r[arm]['monitor_overhead']) <= 0.02 else 'above'} it"
                for arm, label in (("watch", "--monitor"), ("serve", "--metrics-port"))]
    c = r["config"]
    scraper = (f"; the served runs are scraped every {c['scrape_every']:g} s by another process" if "scrape_every" in c
               else "; the served runs are scraped every 0.5 s by a thread of rank 0")
    return (f"P = {prov['P']}, {c['data']}, hidden {c['hidden']}, batch {c['batch_size']}, {c['epochs']} epochs per run, "
            f"{len(off)} interleaved repeats{scraper}; the off runs' own spread is {100 * r['off_spread']:.0f} % of "
            f"their median. Own time: the monitoring code's, over the step time, median of the repeats (largest "
            f"rank, rank 0, and the part of rank 0's spent setting the exporter's metrics); target <= 2 % of the step: "
            f"{' and '.join(verdicts)}.\n\n"
            + tabulate(rows, ["run", "step ms, median (range)", "step / off, median (range)", "own time, largest rank",
                              "rank 0", "rank 0: exporter updates"],
                       tablefmt="pipe", disable_numparse=True,
                       colalign=("left", "right", "right", "right", "right", "right"))
            + "\n\n" + source_line(prov, rel))


def _breakdown_passes(record, prov):
    """Return the passes of a breakdown record: recorded, else its command's ``--passes``, else the
    benchmark's default (7; files written before the record carried the count)."""
    import shlex

    if "passes" in record:
        return record["passes"]
    words = shlex.split(prov["command"])
    return int(words[words.index("--passes") + 1]) if "--passes" in words[:-1] else 7


def _breakdown_table(rel):
    from plots.tables.study_tables import breakdown_table

    record = _load(rel)
    prov = check_quiet(record, rel)
    calls = f" of {record['calls']} calls" if "calls" in record else ""
    what = "reduce-scatter, " if record.get("collective") == "reduce_scatter" else ""
    head = (f"{what}P = {record['P']}, float32, {_breakdown_passes(record, prov)} interleaved passes{calls}, "
            f"algorithm `{record.get('algorithm', 'auto')}`.")
    return head[0].upper() + head[1:] + "\n\n" + breakdown_table(record) + "\n\n" + source_line(prov, rel)


def _model_parallel_table(rel):
    from plots.tables.study_tables import bubble_table, model_parallel_table

    results = _load(rel)
    prov = check_quiet(results, rel)
    q = results["bubble"][0]["Q"] if results["bubble"] else "-"
    return (model_parallel_table(results) + f"\n\nPipeline of Q = {q} stages:\n\n" + bubble_table(results)
            + "\n\n" + source_line(prov, rel))


def _ps_part(part):
    def render(rel):
        from plots.tables.ps_tables import conflict_table, markdown

        study = _load(rel)
        prov = check_quiet(study, rel)
        if not study.get("runs"):
            raise ValueError(f"plots/reference/{rel}: holds no runs to publish")
        names = [(name, _baseline(part, name)) for name in study["part_configs"][part]]
        rows = conflict_table(study["runs"], names)
        reps = study["study"]["repeats"]
        return (f"Median (min-max) over {reps} repeats.\n\n" + markdown(part, rows) + "\n\n" + source_line(prov, rel))
    return render


def _baseline(part, name):
    """The baseline variant of ``name`` in the conflict and retries parts of the PS study."""
    return f"{name.split('-')[0]}-accept" if part == "conflict" else "clean"


def _folder_results(rel, pattern, producer):
    """Return the quiet results files ``pattern`` in ``plots/reference/REL/`` (one per launch of ``producer``),
    their provenance and their paths under ``plots/reference/``.

    Raises
    ------
    ValueError
        When the folder holds no such file, or one was measured on a busy machine.
    """
    paths = sorted(glob.glob(os.path.join(REFERENCE, rel, pattern)))
    if not paths:
        raise ValueError(f"plots/reference/{rel} holds no results file of {producer}")
    rels = [os.path.relpath(path, REFERENCE) for path in paths]
    results = [_load(r) for r in rels]
    return results, [check_quiet(res, r) for res, r in zip(results, rels)], rels


def _non_iid_results(rel):
    """Return the quiet results files of the non-IID study in ``plots/reference/REL/`` (one per launch)."""
    return _folder_results(rel, "non_iid_w*_*.json", "experiments.studies.non_iid_study")


def _non_iid_table(rel):
    from plots.non_iid import markdown

    import datetime

    results, provs, rels = _non_iid_results(rel)
    took = sum((datetime.datetime.fromisoformat(r["finished"]) - datetime.datetime.fromisoformat(r["started"])
                ).total_seconds() for r in results)
    return (markdown(results) + f"\n\nRun time of the {len(results)} launches: {took / 60:.1f} min.\n\n"
            + "\n\n".join(source_line(p, r) for p, r in zip(provs, rels)))


def _non_iid_figures(rel):
    from plots.non_iid import draw

    out = os.path.join(FIGURES, "non_iid.png")
    draw(_non_iid_results(rel)[0], out)
    return [out]


def _levels_table(rel):
    from plots.levels import markdown

    study = _load(rel)
    prov = check_quiet(study, rel)
    return markdown(study) + "\n\n" + source_line(prov, rel, launches_itself=True)


def _shm_table(rel):
    """Return the shared-memory figures of the sweeps in ``plots/reference/REL/`` against their targets."""
    from plots.tables.shm_tables import figures, markdown

    sweeps, provs, rels = _folder_results(rel, "*.json", "experiments.bench.collectives")
    return (markdown(figures([row for sweep in sweeps for row in sweep["rows"]])) + "\n\n"
            + "\n\n".join(source_line(p, r) for p, r in zip(provs, rels)))


def _shm_breakdown_table(rel):
    """Return the shared-memory all-reduce's breakdown in ``plots/reference/REL`` with its provenance."""
    from plots.tables.shm_tables import breakdown_markdown

    record = _load(rel)
    return breakdown_markdown(record) + "\n\n" + source_line(check_quiet(record, rel), rel)


def _hetero_results(rel):
    """Return the quiet results files of the study in ``plots/reference/REL/``, their provenance and paths."""
    return _folder_results(rel, "hetero_w*_*.json", "experiments.studies.hetero_study")


def _hetero_table(rel):
    """Return the published table of the committed results in ``plots/reference/REL/`` with their provenance."""
    from plots.hetero import markdown

    results, provs, rels = _hetero_results(rel)
    return markdown(results) + "\n\n" + "\n\n".join(source_line(p, r) for p, r in zip(provs, rels))


def _hetero_figures(name):
    """Return the drawer of a published figure ``plots/figures/NAME`` of the study in ``plots/reference/REL/``."""
    def draw_figure(rel):
        from plots.hetero import draw

        return [draw(_hetero_results(rel)[0], os.path.join(FIGURES, name))]
    return draw_figure


def _figure(module, name, func="draw"):
    """Return an item's figure drawer: ``plots.MODULE.FUNC(result, out)`` into ``plots/figures/NAME``
    (``MODULE`` relative to ``plots``: a figure command, or ``tables.NAME``)."""
    def draw_figure(rel):
        import importlib

        result = _load(rel)
        check_quiet(result, rel)
        out = os.path.join(FIGURES, name)
        getattr(importlib.import_module(f"plots.{module}"), func)(result, out)
        return [out]
    return draw_figure


def _module_table(module, func, launches_itself=True):
    """Return an item's table renderer: ``plots.MODULE.FUNC(result)`` followed by the file's provenance."""
    def table(rel):
        import importlib

        result = _load(rel)
        prov = check_quiet(result, rel)
        return getattr(importlib.import_module(f"plots.{module}"), func)(result) + "\n\n" + source_line(
            prov, rel, launches_itself)
    return table


#: name -> (reference file or folder under plots/reference/, table renderer or None, figure drawer or None);
#: an item whose reference is not committed yet draws nothing, and its blocks must be empty until it is.
ITEMS = {
    "bench-p2": ("bench/collectives_p2.json", _bench, _bench_figures),
    "training": ("training/default_p4", _training_table, _training_figures),
    "scaling": ("scaling/scale_sim.json", _scaling_table, _figure("scaling", "scaling.png")),
    "trainer-vs-pytorch": ("bench/trainer_vs_pytorch.json", _trainer_table, None),
    "model-parallel-p4": ("model_parallel/p4.json", _model_parallel_table,
                          _figure("model_parallel", "model_parallel_p4.png")),
    "bench-breakdown-p2": ("bench/breakdown_p2.json", _breakdown_table, None),
    "bench-breakdown-p4": ("bench/breakdown_p4.json", _breakdown_table, None),
    "bench-breakdown-rs-p2": ("bench/breakdown_rs_p2.json", _breakdown_table, None),
    "bench-small-p2": ("bench/small_calls_p2.json", _small_calls, None),
    "serving-load": ("serving/load_sweep.json", _serving_load_table, _serving_load_figure),
    "ps-replicas": ("ps/replicas.json", _replicas_table, None),
    "ps-replicas-openmpi": ("ps/replicas_openmpi.json", _replicas_table, None),
    "metrics-overhead": ("bench/metrics_overhead_p4.json", _metrics_overhead_table, None),
    "bench-small-p4": ("bench/small_calls_p4.json", _small_calls, None),
    "ps-conflict": ("ps/conflict_retries.json", _ps_part("conflict"), None),
    "ps-retries": ("ps/conflict_retries.json", _ps_part("retries"), None),
    "non-iid": ("non_iid", _non_iid_table, _non_iid_figures),
    "hetero": ("hetero", _hetero_table, _hetero_figures("hetero.png")),
    "hetero-cluster": ("hetero_cluster", _hetero_table, _hetero_figures("hetero_cluster.png")),
    "hetero-p4": ("hetero_p4", _hetero_table, None),
    "hetero-digits": ("hetero_digits", _hetero_table, None),
    "shm-p2": ("shm/p2", _shm_table, None),
    "shm-p4": ("shm/p4", _shm_table, None),
    "shm-breakdown-p2": ("shm/breakdown_p2.json", _shm_breakdown_table, None),
    "cluster-levels": ("cluster/levels.json", _levels_table, _figure("levels", "cluster_levels.png")),
    "predict-validation": ("predict/validation.json", _module_table("predict", "validation_table"),
                           _figure("predict", "predict_validation.png", "draw_validation")),
    "predict-scale": ("predict/scale.json", _module_table("predict", "scale_markdown"),
                      _figure("predict", "predict_scale.png")),
    "ctr-study": ("cluster/ctr_study.json", _module_table("ctr", "markdown"), _figure("ctr", "ctr_study.png")),
    "ctr-hotkeys": ("ctr/hotkeys.json", _module_table("ctr", "hotkeys_markdown"), None),
    "bench-mpi-baseline-p2": ("bench/mpi_baseline_p2.json", _mpi_baseline_table, None),
    "cluster-compression": ("cluster/compression_study.json", _module_table("tables.cluster_tables", "compression_markdown"),
                            _figure("cluster", "cluster_compression.png", "draw_compression")),
    "cluster-ps": ("cluster/ps_study.json", _module_table("tables.cluster_tables", "ps_markdown"),
                   _figure("cluster", "cluster_ps.png", "draw_ps")),
    "cluster-collectives": ("cluster/collectives_study.json", _module_table("tables.cluster_tables", "collectives_markdown"),
                            _figure("cluster", "cluster_collectives.png")),
    "elastic-p4": ("elastic/elastic_p4.json", _module_table("recovery", "markdown"), _figure("recovery", "elastic_p4.png")),
    "elastic-p8": ("elastic/elastic_p8.json", _module_table("recovery", "markdown"), _figure("recovery", "elastic_p8.png")),
    "elastic-cluster": ("elastic/elastic_cluster.json", _module_table("recovery", "markdown"),
                        _figure("recovery", "elastic_cluster.png")),
}


def figure_names():
    """Return the file names of the figures the items draw (without drawing them), a set of str.

    Examples
    --------
    >>> "scaling.png" in figure_names()
    True
    """
    names = {"training_curves.png", "training_time.png", "scaling.png", "model_parallel_p4.png", "non_iid.png",
             "serving_load.png", "cluster_levels.png", "predict_validation.png", "predict_scale.png", "ctr_study.png",
             "cluster_compression.png", "cluster_ps.png", "cluster_collectives.png", "hetero.png", "hetero_cluster.png",
             "elastic_p4.png", "elastic_p8.png", "elastic_cluster.png"}
    for name, (ref, _, draw) in ITEMS.items():
        if draw is _bench_figures:
            results = _load(ref)
            names |= {f"bench_{op}_p{results['P']}.png" for op in dict.fromkeys(r["collective"] for r in results["rows"])}
    return names
