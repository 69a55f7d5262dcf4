"""Every command block of README.md and of the docs (docs/**/*.md) runs as written, in a quick mode, so
neither can drift.

The test reads README.md and the docs' pages in turn, takes every ```bash block (and every ```python block whose first line says
``# save as FILE and run: COMMAND``), splits it into commands (``\\`` continuations joined, comments
dropped) and looks each command up in :data:`CHECKS`:

* :class:`Run` runs the command as written, in a fresh directory (so ``results/`` and ``runs/`` start
  empty, as in a fresh clone), with the quick flags of the entry appended (``argparse`` keeps the last
  value of a repeated flag), under a hard timeout; it must exit 0. ``mpiexec`` is the one beside the
  interpreter, with ``MPIEXEC_ARGS`` (``tests.mpirun``), ``python`` is the interpreter running the tests.
* :class:`Help` is for commands too slow even in a quick mode: every ``--flag`` of the command must
  be one its module's ``--help`` lists, and the files the command would write are taken from the
  committed reference results (``provides``), so the commands after it in the block run on them.
  ``covered`` names the test that runs the same code.
* :class:`Covered` names the test that checks the command (``make test`` is the suite itself; the
  emulated cluster needs Linux namespaces and is run by ``tests/test_cluster.py``); that test must
  exist.

A command without an entry fails the test, and so does an entry whose command is no longer in the
README. Commands quoted inline in the prose must name an existing module and flags its ``--help``
lists. The blocks run in order, one fresh directory per block; a command already run in an earlier
block (``make run`` is shown twice) is not run again.
"""
import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import pytest

from tests.mpirun import launcher_args, launcher_env, mpiexec_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
#: The documents whose commands are checked: the README, then the docs' pages (sorted).
DOCUMENTS = [README] + sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(ROOT, "docs"))
                              if "_build" not in dp for f in fs if f.endswith(".md"))
REF = os.path.join(ROOT, "plots", "reference")


@dataclass(frozen=True)
class Run:
    """Run the command with ``extra`` arguments appended (after any ``--`` separator's command)."""

    extra: tuple = ()
    timeout: float = 120


@dataclass(frozen=True)
class Help:
    """Check the command's flags against its module's ``--help``; ``provides`` maps the paths it
    would write (relative to the block's directory) to committed files that stand in for them."""

    covered: str
    provides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Covered:
    """The command is checked by the test ``covered`` (``path::name``, or ``make test``)."""

    covered: str
    why: str


_QUICK_TRAIN = ("--epochs", "1", "--no-progress")

#: README command (as written, comments dropped, one space between words) -> how it is checked.
CHECKS = {
    # The two commands
    "make run": Run(),  # checked through `make -n run`: the recipe, run with --epochs 1
    "make test": Covered("make test", "the test suite itself"),
    "make docs": Covered("tests/test_docs.py::test_docs_build_with_no_warning", "the same sphinx-build -W"),
    "make results": Covered("tests/test_docs.py::test_published_tables_equal_the_committed_result_files",
                            "plots.publish --check renders every item as make results does"),
    # Parameter server: versions, conflicts and retries (docs/ps.md)
    "mpiexec -n 5 python -m training.train --mode ps --consistency asp --ps-conflict cas --ps-conflict-lag 3 "
    "--ps-retries 3": Run(_QUICK_TRAIN),
    "mpiexec -n 5 python -m experiments.studies.ps_study --parts conflict,retries --repeats 3 --out "
    "results/ps_conflict": Help("tests/test_ps_versions.py::test_versions_conflicts_retries_and_bad_requests_on_four_ranks"),
    # Model parallelism
    "mpiexec -n 4 python -m training.train --tensor-parallel 2 --pipeline-parallel 2 --micro-batches 4":
        Help("tests/test_model_parallel.py::test_cli_writes_grid_summary_and_refuses_bad_grids"),
    "mpiexec -n 8 python -m training.train --tensor-parallel 2 --pipeline-parallel 2 --hidden 512,512,512":
        Help("tests/test_model_parallel.py::test_equivalence_on_eight_ranks"),
    "mpiexec -n 4 python -m experiments.studies.model_parallel_study --out results/model_parallel_p4.json":
        Help("tests/test_model_parallel.py::test_study_grids_and_plot",
             {"results/model_parallel_p4.json": "model_parallel/p4.json"}),
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m "
    "experiments.studies.model_parallel_study --out results/model_parallel_p4_1gbit.json --bubble-micro-batches ''":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),  # runs only with namespaces
    "python -m plots.model_parallel results/model_parallel_p4.json":
        Help("tests/test_model_parallel.py::test_study_grids_and_plot"),
    # Simulator
    "python -m experiments.studies.scale_sim --out results/scale_sim.json":
        Run(("--max-p", "64", "--sizes", "1KiB,1MiB")),
    "python -m plots.scaling results/scale_sim.json --out results/scaling.png": Run(),
    # PyTorch and JAX
    "mpiexec -n 2 python torch_example.py":
        Covered("tests/test_interop.py::test_ddp_hook_and_distributed_optimizer_on_two_ranks",
                "the same calls (bfloat16 all-reduce, DDP with commlab_hook and PowerSGD, "
                "DistributedOptimizer) with oracles; PyTorch's import is too slow for a second run"),
    "mpiexec -n 2 python -m experiments.jax_example --steps 100":
        Covered("tests/test_interop.py::test_jax_example_on_two_ranks",
                "needs JAX (not a dependency); skipped without it"),
    # Collectives
    "mpiexec -n 4 python example.py": Run(),
    # Benchmarks
    "mpiexec -n 4 python -m experiments.bench.collectives --out results/bench_p4":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks", {"results/bench_p4.json": "bench_p4.json"}),
    "mpiexec -n 2 python -m experiments.bench.collectives --out results/bench_p2":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks", {"results/bench_p2.json": "bench_p2.json"}),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops allreduce --max-bytes 1M --iters 50":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks"),
    "python -m plots.bench results/bench_p4.json --markdown --out results":
        Help("tests/test_bench.py::test_tune_and_plot_on_a_real_sweep"),
    "python -m experiments.bench.tune results/bench_p2.json results/bench_p4.json --out results/tuning.json --tolerance 0.15":
        Run(),
    "COMMLAB_TUNING=results/tuning.json mpiexec -n 4 python -m experiments.demo":
        Help("tests/test_bench.py::test_tune_table_round_trips_through_select"),
    # Gradient compression
    "mpiexec -n 4 python -m training.train --compression topk --compression-arg ratio=0.01":
        Help("tests/test_training_mpi.py::test_crashed_rank_ends_a_compressed_run_within_the_timeout"),
    # Emulated cluster (namespaces)
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m training.train":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 2 --link 100mbit --calibrate "
    "--out results/cluster/calibrate_100mbit.json":
        Help("tests/test_cluster.py::test_link_rate_within_tolerance"),
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 2 --link 1gbit -- python -m "
    "experiments.bench.collectives --ops allreduce --algorithms ring,rabenseifner,2d,tree,mpi --min-bytes 64K "
    "--max-bytes 64M --iters 5 --warmup 1 --max-time 3 --repeats 3 --out results/cluster/collectives_1gbit":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.collectives 1gbit=results/cluster/collectives_1gbit.json "
    "100mbit=results/cluster/collectives_100mbit.json --ranks-per-node 2 --out results/cluster/collectives":
        Covered("tests/test_cluster.py::test_inter_node_bytes_match_the_algorithms_formulas",
                "reads the emulated cluster's sweeps (namespaces); its byte counts are tested there"),
    "python -m plots.cluster results/cluster/collectives.json":
        Covered("tests/test_cluster.py::test_inter_node_bytes_match_the_algorithms_formulas",
                "draws the emulated cluster's results (namespaces)"),
    # Compression across emulated nodes
    "mpiexec -n 4 python -m experiments.studies.compression_sweep --seeds 0 --epochs 6 --out results/cluster/compression_shm":
        Help("tests/test_compression_study.py::test_sweep_writes_results_and_plot"),
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 100mbit -- python -m "
    "experiments.studies.compression_sweep --seeds 0 --epochs 6 --out results/cluster/compression_100mbit":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.compression shm=results/cluster/compression_shm "
    "1gbit=results/cluster/compression_1gbit 100mbit=results/cluster/compression_100mbit --target 0.94 "
    "--out results/cluster/compression":
        Help("tests/test_cluster.py::test_compression_report_reads_epoch_times"),
    "python -m plots.cluster results/cluster/compression.json":
        Covered("tests/test_cluster.py::test_compression_report_reads_epoch_times",
                "draws the emulated cluster's results (namespaces)"),
    # Parameter server against all-reduce across emulated nodes
    "python -m experiments.cluster.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m training.train --epochs 5 "
    "--algorithm ring --run-dir results/cluster/ps --name dp-ring-r1 --no-progress":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.emulate --nodes 6 --ranks-per-node 1 --link 1gbit -- python -m training.train --mode ps "
    "--servers 2 --consistency bsp --epochs 5 --run-dir results/cluster/ps --name ps-bsp-s2-r1 --no-progress":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.ps results/cluster/ps --out results/cluster/ps_vs_allreduce":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m plots.cluster results/cluster/ps_vs_allreduce.json":
        Covered("tests/test_cluster.py::test_nodes_found_as_configured",
                "draws the emulated cluster's results (namespaces)"),
    # Calibrating the simulator (emulated cluster)
    "python -m experiments.cluster.emulate --nodes 2 --ranks-per-node 2 --link 1gbit -- python -m "
    "experiments.bench.collectives --ops allreduce --algorithms ring,rabenseifner,2d,tree,recursive_doubling "
    "--min-bytes 64K --max-bytes 64M --iters 5 --warmup 1 --max-time 3 --repeats 2 --out results/cluster/fit_2x2":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.model --intra results/cluster/fit_1x4.json --fit 2=results/cluster/fit_2x2.json "
    "--fit 1=results/cluster/fit_4x1.json --predict 2=results/cluster/collectives_1gbit.json "
    "--predict 2=results/cluster/fit_4x2_rd.json --out results/cluster/model":
        Help("tests/test_cluster.py::test_model_replay_equals_the_simulator_without_sharing"),
    "python -m plots.cluster results/cluster/model.json":
        Covered("tests/test_cluster.py::test_model_replay_equals_the_simulator_without_sharing",
                "draws the emulated cluster's results (namespaces)"),
    # Inference
    "mpiexec -n 4 python -m training.train --name served":
        Help("tests/test_inference.py::test_a_tensor_parallel_training_run_is_served_resharded"),
    "mpiexec -n 4 python -m inference.serve --checkpoint runs/served --replicas 3 --balance least-outstanding "
    "--requests 2000 --rate 1000 --run-dir results/serve":
        Help("tests/test_inference.py::test_replicated_serving_answers_equal_the_single_process_prediction"),
    "mpiexec -n 5 python -m inference.serve --checkpoint runs/served --replicas 2 --tensor-parallel 2 ...":
        Help("tests/test_inference.py::test_tensor_parallel_replica_answers"),
    "mpiexec -n 3 python -m inference.serve --checkpoint runs/served --replicas 2 --http 8000":
        Help("tests/test_inference_http.py::test_open_inference_protocol_answers_refuses_bad_bodies_survives_a_burst_and_drains"),
    "mpiexec -n 2 python -m inference.serve --checkpoint runs/served --replicas 1 --service-ms 20 --max-batch 8 "
    "--rate 600 --requests 1200 --run-dir results/serve-600":
        Help("tests/test_inference.py::test_batches_fill_while_the_replica_is_busy_and_throughput_follows_the_offered_load"),
    "mpiexec -n 2 python -m inference.serve --checkpoint runs/served --replicas 1 --service-ms 20 --max-batch 8 "
    "--rate 1200 --requests 2400 --slo-ms 60 --run-dir results/serve-slo":
        Help("tests/test_inference.py::test_a_latency_objective_refuses_early_and_holds_p99"),
    # Parameter server
    "mpiexec -n 5 python -m training.train --mode ps --servers 1 --consistency ssp --staleness 2 --straggler 2:4":
        Help("tests/test_ps_train.py::test_bsp_matches_data_parallel_training"),
}


def _logical_lines(text):
    """Join ``\\`` continuations; return the non-empty lines."""
    return [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip()]


def readme_commands(path=None):
    """Return the blocks of ``path`` (default: every document, in order) as lists of ``(command, files)``: ``command`` is the token list
    (comments dropped), ``files`` maps file names a Python block is saved as to its source."""
    if path is None:
        return [b for doc in DOCUMENTS for b in readme_commands(doc)]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    blocks = []
    for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        if lang in ("bash", "sh", "shell", "console"):
            cmds = [shlex.split(ln, comments=True) for ln in _logical_lines(body)]
            blocks.append([(c, {}) for c in cmds if c])
        elif lang == "python":
            m = re.match(r"#\s*save as (\S+) and run:\s*(.+)", body.splitlines()[0])
            if m:
                cmd = [w.rsplit("/", 1)[-1] if w.startswith(".venv/bin/") else w for w in shlex.split(m.group(2))]
                blocks.append([(cmd, {m.group(1): body})])
    return blocks


def inline_commands(path=None):
    """Return the commands quoted inline in the prose of ``path`` (default: every document; code spans
    with ``python -m``, outside the blocks) as token lists."""
    if path is None:
        return [c for doc in DOCUMENTS for c in inline_commands(doc)]
    with open(path, encoding="utf-8") as f:
        prose = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
    spans = re.findall(r"`([^`]*python -m [^`]*)`", prose)
    return [shlex.split(" ".join(span.split())) for span in spans]


def _key(cmd):
    return " ".join(shlex.quote(w) if w == "" else w for w in cmd)


def _module_of(cmd):
    """Return the ``python -m`` module (before any ``--``) of a command, or None."""
    head = cmd[: cmd.index("--")] if "--" in cmd else cmd
    return head[head.index("-m") + 1] if "-m" in head else None


def _flags(cmd):
    head = cmd[: cmd.index("--")] if "--" in cmd else cmd
    return [w.split("=", 1)[0] for w in head if w.startswith("--")]


def _lists(help_text, flag):
    """Whether ``help_text`` lists ``flag`` as a whole word (``--out`` is not ``--outdir``)."""
    return re.search(re.escape(flag) + r"(?![\w-])", help_text) is not None


def _argv(cmd, extra=()):
    """Return (env, argv) of a README command: ``mpiexec``/``python`` resolved, quick flags appended."""
    env = launcher_env()
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    while cmd and re.match(r"^[A-Z_][A-Z0-9_]*=", cmd[0]):
        name, value = cmd[0].split("=", 1)
        env[name] = value
        cmd = cmd[1:]
    argv = []
    for i, w in enumerate(cmd):
        if w == "mpiexec" and i == 0:
            argv += [mpiexec_path(), *launcher_args()]
        elif w == "python":
            argv.append(sys.executable)
        else:
            argv.append(w)
    return env, argv + list(extra)


def _run(argv, env, cwd, timeout):
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(argv)}: no exit within {timeout} s\n{e.output}")
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
    print(f"{time.monotonic() - start:6.1f} s  {' '.join(argv)[:150]}")
    return proc.stdout


_HELP = """
import contextlib, io, json, runpy, sys
out = {}
for mod in sys.argv[1:]:
    buf = io.StringIO()
    sys.argv = [mod, "--help"]
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_module(mod, run_name="__main__", alter_sys=True)
    except SystemExit:
        pass
    out[mod] = buf.getvalue()
print("\\n@@HELP@@" + json.dumps(out))
"""


def _help_texts(modules):
    env, argv = _argv(["python", "-c", _HELP, *sorted(modules)])
    out = _run(argv, env, ROOT, 120)
    return json.loads(out.split("@@HELP@@", 1)[1])


def _test_exists(ref):
    if ref == "make test":
        return True
    path, name = ref.split("::")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body)


def test_every_readme_command_has_an_entry_and_every_entry_a_command():
    keys = [_key(c) for block in readme_commands() for c, _ in block]
    missing = [k for k in keys if k not in CHECKS]
    assert not missing, ("README/docs commands without an entry in tests/test_readme.py CHECKS (add one: "
                         "Run with quick flags, Help or Covered):\n" + "\n".join(missing))
    stale = [k for k in CHECKS if k not in keys]
    assert not stale, "CHECKS entries whose command is in neither README.md nor docs/:\n" + "\n".join(stale)
    absent = [c.covered for c in CHECKS.values() if isinstance(c, (Help, Covered)) and not _test_exists(c.covered)]
    assert not absent, f"entries name tests that do not exist: {absent}"


@pytest.fixture(scope="module")
def help_texts():
    """``--help`` of every module a Help entry or an inline command names, from one interpreter."""
    helps = {_module_of(c) for block in readme_commands() for c, _ in block
             if isinstance(CHECKS.get(_key(c)), Help)}
    helps |= {m for m in map(_module_of, inline_commands()) if m and not re.search(r"[A-Z]", m)}
    return _help_texts(helps)


def test_inline_commands_name_modules_and_flags_that_exist(help_texts):
    """Commands quoted in the prose (``mpiexec -n 4 python -m experiments.studies.compression_sweep``, ...) name
    a module that exists and only flags its ``--help`` lists; placeholders (``plots.NAME``) are skipped."""
    cmds = inline_commands()
    assert len(cmds) >= 10, cmds
    bad = []
    for cmd in cmds:
        mod = _module_of(cmd)
        if re.search(r"[A-Z]", mod):
            continue
        if not os.path.isfile(os.path.join(ROOT, *mod.split(".")) + ".py"):
            bad.append(f"{_key(cmd)}: no module {mod}")
            continue
        unknown = [f for f in _flags(cmd) if not _lists(help_texts[mod], f)]
        if unknown:
            bad.append(f"{_key(cmd)}: {mod} --help does not list {unknown}")
    assert not bad, "\n".join(bad)


def test_readme_commands_run(tmp_path, help_texts):
    """Run every block in order (quick flags), check the flags of the ones too slow to run."""
    blocks = readme_commands()
    texts = help_texts
    done = set()
    for b, block in enumerate(blocks):
        cwd = tmp_path / f"block{b}"
        cwd.mkdir()
        for cmd, files in block:
            for name, source in files.items():
                (cwd / name).write_text(source)
            check = CHECKS.get(_key(cmd))
            if isinstance(check, Run) and _key(cmd) in done:
                continue  # `make run` is shown twice
            done.add(_key(cmd))
            if isinstance(check, Help):
                mod = _module_of(cmd)
                unknown = [f for f in _flags(cmd) if not _lists(texts[mod], f)]
                assert not unknown, f"{_key(cmd)}: {mod} --help does not list {unknown}"
                for dest, ref in check.provides.items():
                    (cwd / dest).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(os.path.join(REF, ref), cwd / dest)
            elif isinstance(check, Run) and cmd == ["make", "run"]:
                _make_run(cwd)
            elif isinstance(check, Run):
                env, argv = _argv(cmd, check.extra)
                _run(argv, env, cwd, check.timeout)


def _make_run(cwd):
    """``make run`` as the Makefile spells it (``make -n``), trained for one epoch: it writes the run
    and its two PNGs into runs/NAME/."""
    recipe = subprocess.run(["make", "-n", "run"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    lines = [ln.split() for ln in recipe.splitlines() if "training.train" in ln or "plots.training" in ln]
    assert [ln[-2:] for ln in lines] == [["-m", "training.train"], ["plots.training", "runs/latest"]], recipe
    assert lines[0][lines[0].index("-n") + 1] == "4", recipe
    for ln in lines:
        cmd = [os.path.basename(w) if w.startswith(".venv") else w for w in ln]
        env, argv = _argv(cmd, _QUICK_TRAIN if "training.train" in ln else ())
        _run(argv, env, cwd, 120)
    run = (cwd / "runs" / "latest").resolve()
    assert (run / "training_curves.png").is_file() and (run / "training_time.png").is_file()
