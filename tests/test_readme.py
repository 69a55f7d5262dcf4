"""Every command block of README.md and of the docs (docs/**/*.md) runs as written, in a quick mode, so
neither can drift.

The test reads README.md and the docs' pages in turn, takes every ```bash block (and every ```python block whose first line says
``# save as FILE and run: COMMAND``), splits it into commands (``\\`` continuations joined, comments
dropped) and looks each command up in :data:`CHECKS`:

* :class:`Run` runs the command as written, in a fresh directory (so ``results/`` and ``runs/`` start
  empty, as in a fresh clone), with the quick flags of the entry appended (``argparse`` keeps the last
  value of a repeated flag), under a hard timeout; it must exit 0, or, for a run whose entry names
  ``records`` (a crash run), leave a ``runs/latest/summary.json`` holding them. A command written for
  one launcher's options runs where the tests' ``mpiexec`` is that launcher's. ``mpiexec`` is the one beside the
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

import pytest

from tests.mpirun import launcher, launcher_args, launcher_env, mpiexec_path
from tests.readme_checks import _QUICK_TRAIN, CHECKS, Covered, Help, Run  # the table of every documented command

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
#: The documents whose commands are checked: the README, then the docs' pages (sorted).
DOCUMENTS = [README] + sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(ROOT, "docs"))
                              if "_build" not in dp for f in fs if f.endswith(".md"))
REF = os.path.join(ROOT, "plots", "reference")




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


def _run(argv, env, cwd, timeout, status=True):
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(argv)}: no exit within {timeout} s\n{e.output}")
    assert proc.returncode == 0 or not status, f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
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


def test_readme_names_everything_make_run_installs():
    """The README's list of what ``make run`` installs names every ``install_requires`` entry of setup.py
    and each package of the extras the Makefile's ``venv`` recipe installs."""
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        call = next(n for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.Call)
                    and getattr(n.func, "id", "") == "setup")
    kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
        extras = re.search(r"pip install -q -e '\.\[\$\(MPI\),([a-z,]+)\]'", f.read()).group(1).split(",")
    wanted = kw["install_requires"] + kw["extras_require"]["mpich"] + [d for e in extras for d in kw["extras_require"][e]]
    names = [re.split(r"[<>=!\[ ;]", d, maxsplit=1)[0] for d in wanted]
    with open(README, encoding="utf-8") as f:
        para = re.search(r"`make run` installs (.*?)\n\n", f.read(), flags=re.S).group(1)
    missing = [n for n in names if n.lower().replace("_", "") not in para.lower().replace("_", "")]
    assert not missing, f"README's list of what make run installs omits {missing}"


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
        path = os.path.join(ROOT, *mod.split("."))
        if not (os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__main__.py"))):
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
            elif isinstance(check, Run) and check.launcher and check.launcher != launcher():
                continue  # written for the other launcher's options: run under it (make test MPI=openmpi)
            elif isinstance(check, Run):
                env, argv = _argv(cmd, check.extra)
                out = _run(argv, env, cwd, check.timeout, status=not check.records)
                _check_records(cwd, check.records, out)


def _check_records(cwd, records, out):
    """Assert that the run's ``runs/latest/summary.json`` holds every ``(key, value)`` of ``records``."""
    if not records:
        return
    path = cwd / "runs" / "latest" / "summary.json"
    assert path.is_file(), f"no {path}:\n{out[-3000:]}"
    summary = json.loads(path.read_text())
    wrong = {k: summary.get(k) for k, v in records if summary.get(k) != v}
    assert not wrong, f"{path}: {wrong}, the docs say {dict(records)}:\n{out[-3000:]}"


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
