"""Publish results as code: every table and figure of the README and the docs, from committed result files.

``python -m plots.publish`` (``make results``) reads the reference result files under
``plots/reference/`` (each written by a study or benchmark with its provenance: command, versions, P,
cores, load before and during; see :mod:`experiments.results`), redraws the figures into
``plots/figures/`` and rewrites every marked table block of ``README.md`` and ``docs/*.md``::

    <!-- results:NAME -->
    ...generated text...
    <!-- /results:NAME -->

``python -m plots.publish --check`` changes nothing: it exits 1 and prints a diff when a marked block
differs from what the committed files give, when a block names no known item, or when a figure the
documents show is drawn by no item (the test suite runs this check, so no published number can go
stale without a failing test). A reference file measured on a busy machine (``noisy``, or without
provenance) is refused (:func:`check_quiet`).

Examples
--------
>>> from plots import publish
>>> text = "a\\n<!-- results:x -->\\nold\\n<!-- /results:x -->\\nb\\n"
>>> print(publish.fill(text, {"x": "new"}), end="")
a
<!-- results:x -->
new
<!-- /results:x -->
b
"""
import argparse
import difflib
import glob
import json
import os
import re
import sys

__all__ = ["ITEMS", "check_quiet", "fill", "blocks", "render_tables", "draw_figures", "main"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "plots", "reference")
FIGURES = os.path.join(ROOT, "plots", "figures")
#: The documents whose marked blocks and figures are published.
DOCUMENTS = ("README.md", "docs/*.md", "docs/*/*.md")
_BLOCK = re.compile(r"(<!-- results:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def _load(rel):
    path = os.path.join(REFERENCE, rel)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except ValueError as exc:
        raise ValueError(f"plots/reference/{rel}: not a JSON results file ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"plots/reference/{rel}: not a results file (a JSON object)")
    return data


def check_quiet(record, rel):
    """Raise ``ValueError`` unless ``record`` carries provenance of a quiet machine.

    Parameters
    ----------
    record : dict
        A results file's contents.
    rel : str
        Its path under ``plots/reference/`` (for the message).
    """
    prov = record.get("provenance") if isinstance(record, dict) else None
    if prov is not None and not isinstance(prov, dict):
        raise ValueError(f"plots/reference/{rel}: its provenance is not a record (a JSON object)")
    if prov is None:
        raise ValueError(f"plots/reference/{rel} has no provenance record: measure it again "
                         "(every study and benchmark writes one)")
    if prov.get("noisy", True):
        load = prov.get("load", {})
        raise ValueError(f"plots/reference/{rel} was measured on a busy machine (load {load.get('before')} "
                         f"before, {load.get('during_max')} at most during, threshold {prov.get('max_load')}): "
                         "it is never published")
    return prov


def source_line(prov, rel):
    """Return the one-line provenance that follows every published table."""
    v = prov["versions"]
    lib = v.get("mpi_library") or "no MPI library"
    load = prov.get("load")
    where = ("a simulation (no measurement)" if load is None or prov.get("P") is None else
             f"P = {prov['P']}, {prov['cores']} cores, load average {load['before']:.2f} before and "
             f"{load['during_max']:.2f} at most during")
    command = prov["command"]
    if prov.get("P") and prov.get("load") is not None and not command.startswith("mpiexec"):
        command = f"mpiexec -n {prov['P']} {command}"
    return (f"*From `plots/reference/{rel}`: `{command}`, {where}, {lib}, Python {v['python']}, "
            f"NumPy {v['numpy']}, {prov['date'][:10]}.*")


# ---------------------------------------------------------------------------------------------- items

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

    from training.metrics import default_max_load, is_quiet

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

    from training.sizes import format_bytes

    result = _load(rel)
    prov = check_quiet(result, rel)
    algs = [a for a in next(iter(result["crossovers"].values()))]
    cells = [[format_bytes(int(size))] + [("never" if cross.get(a) is None else str(cross[a])) for a in algs]
             for size, cross in result["crossovers"].items()]
    table = tabulate(cells, headers=["message"] + algs,
                     tablefmt="pipe", disable_numparse=True, colalign=["left"] + ["right"] * len(algs))
    return table + "\n\n" + source_line(prov, rel)


def _figure(module, name):
    """Return an item's figure drawer: ``plots.MODULE.draw(result, out)`` into ``plots/figures/NAME``."""
    def draw_figure(rel):
        import importlib

        result = _load(rel)
        check_quiet(result, rel)
        out = os.path.join(FIGURES, name)
        importlib.import_module(f"plots.{module}").draw(result, out)
        return [out]
    return draw_figure


def _trainer_table(rel):
    from plots.tables import trainer_table

    results = _load(rel)
    prov = check_quiet(results, rel)
    model = "-".join(map(str, results["model"]))
    head = (f"MLP {model}, float32, one thread: forward, softmax cross-entropy, backward and optimizer step; "
            f"median (min-max) of {results['repeats']} alternating repeats; PyTorch {results['torch']}.")
    return head + "\n\n" + trainer_table(results["cells"]) + "\n\n" + source_line(prov, rel)


def _breakdown_table(rel):
    from plots.tables import breakdown_table

    record = _load(rel)
    prov = check_quiet(record, rel)
    head = (f"P = {record['P']}, float32, {len(next(iter(record['sizes'].values()))['auto'])} interleaved passes, "
            f"algorithm `{record.get('algorithm', 'auto')}`.")
    return head + "\n\n" + breakdown_table(record) + "\n\n" + source_line(prov, rel)


def _model_parallel_table(rel):
    from plots.tables import bubble_table, model_parallel_table

    results = _load(rel)
    prov = check_quiet(results, rel)
    q = results["bubble"][0]["Q"] if results["bubble"] else "-"
    return (model_parallel_table(results) + f"\n\nPipeline of Q = {q} stages:\n\n" + bubble_table(results)
            + "\n\n" + source_line(prov, rel))


def _ps_part(part):
    def render(rel):
        from plots.ps_tables import conflict_table, markdown

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


def _non_iid_results(rel):
    """Return the quiet results files of the non-IID study in ``plots/reference/REL/`` (one per launch)."""
    paths = sorted(glob.glob(os.path.join(REFERENCE, rel, "non_iid_w*_*.json")))
    if not paths:
        raise ValueError(f"plots/reference/{rel} holds no results file of experiments.studies.non_iid_study")
    results = [_load(os.path.relpath(path, REFERENCE)) for path in paths]
    provs = [check_quiet(r, os.path.relpath(path, REFERENCE)) for r, path in zip(results, paths)]
    return results, provs, [os.path.relpath(path, REFERENCE) for path in paths]


def _non_iid_table(rel):
    from plots.non_iid import markdown

    results, provs, rels = _non_iid_results(rel)
    return markdown(results) + "\n\n" + "\n\n".join(source_line(p, r) for p, r in zip(provs, rels))


def _non_iid_figures(rel):
    from plots.non_iid import draw

    out = os.path.join(FIGURES, "non_iid.png")
    draw(_non_iid_results(rel)[0], out)
    return [out]


#: name -> (reference file or folder under plots/reference/, table renderer or None, figure drawer or None);
#: an item whose reference is not committed yet draws nothing, and a block naming it fails the check.
ITEMS = {
    "bench-p2": ("bench/collectives_p2.json", _bench, _bench_figures),
    "training": ("training/default_p4", _training_table, _training_figures),
    "scaling": ("scaling/scale_sim.json", _scaling_table, _figure("scaling", "scaling.png")),
    "trainer-vs-pytorch": ("bench/trainer_vs_pytorch.json", _trainer_table, None),
    "model-parallel-p4": ("model_parallel/p4.json", _model_parallel_table,
                          _figure("model_parallel", "model_parallel_p4.png")),
    "ps-conflict": ("ps/conflict_retries.json", _ps_part("conflict"), None),
    "ps-retries": ("ps/conflict_retries.json", _ps_part("retries"), None),
    "non-iid": ("non_iid", _non_iid_table, _non_iid_figures),
}


# ------------------------------------------------------------------------------------------ machinery

def blocks(text):
    """Return the names of the marked result blocks of ``text``, in order."""
    return [m.group("name") for m in _BLOCK.finditer(text)]


def fill(text, tables):
    """Return ``text`` with each marked block's body replaced by ``tables[name]`` (a trailing newline added).

    Raises
    ------
    KeyError
        When a block names an item ``tables`` does not hold.
    """
    return _BLOCK.sub(lambda m: m.group(1) + tables[m.group("name")].rstrip("\n") + "\n" + m.group(4), text)


def render_tables(names=None):
    """Return {item name: generated text} for the items that publish a table."""
    return {n: render(ref) for n, (ref, render, _) in ITEMS.items() if render and (names is None or n in names)}


def draw_figures():
    """Draw every item's figures into ``plots/figures/``; return their paths."""
    paths = []
    for ref, _, draw in ITEMS.values():
        if draw and os.path.exists(os.path.join(REFERENCE, ref)):
            paths += draw(ref)
    return paths


def _documents():
    return sorted({p for pattern in DOCUMENTS for p in glob.glob(os.path.join(ROOT, pattern))})


def _shown_figures(text):
    return set(re.findall(r"plots/figures/([\w.-]+\.png)", text))


def _figure_names():
    """File names of the figures the items draw (without drawing them)."""
    names = {"training_curves.png", "training_time.png", "scaling.png", "model_parallel_p4.png", "non_iid.png"}
    for name, (ref, _, draw) in ITEMS.items():
        if draw is _bench_figures:
            results = _load(ref)
            names |= {f"bench_{op}_p{results['P']}.png" for op in dict.fromkeys(r["op"] for r in results["rows"])}
    return names


def check(texts=None):
    """Return a list of problems: blocks that differ from the committed files, unknown items, undrawn figures.

    Parameters
    ----------
    texts : dict, optional
        {path relative to the project root: text} to check instead of the documents on disk.

    Returns
    -------
    list of str
        One entry per problem (a unified diff for a block that differs); empty when all is published
        as the committed result files give it.
    """
    if texts is None:
        texts = {}
        for path in _documents():
            with open(path, encoding="utf-8") as f:
                texts[os.path.relpath(path, ROOT)] = f.read()
    problems = []
    names = {n for text in texts.values() for n in blocks(text)}
    unknown = sorted(names - set(ITEMS))
    problems += [f"a results block names no item: {n} (known: {', '.join(ITEMS)})" for n in unknown]
    tables = render_tables(names - set(unknown))
    tables.update({n: f"<!-- results:{n} is unknown -->" for n in unknown})
    drawn = _figure_names()
    for rel, text in texts.items():
        want = fill(text, tables)
        if want != text and not unknown:
            diff = difflib.unified_diff(text.splitlines(), want.splitlines(), f"{rel} (as written)",
                                        f"{rel} (from the committed result files)", lineterm="", n=1)
            problems.append("\n".join(diff))
        problems += [f"{rel} shows plots/figures/{f}, which no published item draws" for f in
                     sorted(_shown_figures(text) - drawn)]
    return problems


def main(argv=None):
    """Regenerate (default) or check (``--check``) every published table and figure."""
    p = argparse.ArgumentParser(prog="python -m plots.publish", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 with a diff when a published table differs from the committed "
                        "result files, or a shown figure has no item that draws it")
    args = p.parse_args(argv)
    try:
        if args.check:
            problems = check()
            for problem in problems:
                print(problem)
            print(f"{len(problems)} problem(s) in the published results" if problems
                  else "every published table matches the committed result files")
            return 1 if problems else 0
        tables = render_tables()
        for path in _documents():
            with open(path, encoding="utf-8") as f:
                text = f.read()
            new = fill(text, tables)
            if new != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
                print(f"wrote {os.path.relpath(path, ROOT)}")
        for path in draw_figures():
            print(f"wrote {os.path.relpath(path, ROOT)}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
