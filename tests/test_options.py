"""Every command's options have declared ranges, and every value outside one is refused alike.

The walk: each command of the project (every module under ``training``, ``inference``,
``experiments`` and ``plots`` that runs as ``python -m``) is asked for ``--help`` in this process,
which builds its parsers (:class:`training.settings.options.Parser`); every option of every parser is then
given the texts its declared range must refuse (below, above, 0 where it is below, negative, huge,
NaN, inf, a word for a number, a missing file; :meth:`training.settings.options.Declared.edges`). Oracle: exit
status 2, exactly one line holding ``error:`` that names the option, no traceback, no usage block,
and nothing written in the working folder. A command whose parser holds an option with no declared
range fails the walk at ``--help`` (the parser refuses to parse).

Then the cases that a range alone does not catch: options that only make sense together, and
settings whose memory would not fit, refused by each command before it allocates.
"""
import contextlib
import importlib
import io
import os
import pkgutil

import pytest

from training.settings.options import Declared, Parser

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _commands():
    """Every module of the four command-bearing packages that runs as ``python -m`` (has a ``__main__`` guard)."""
    found = []
    for package in ("training", "inference", "experiments", "plots"):
        for info in pkgutil.walk_packages([os.path.join(_ROOT, package)], prefix=package + "."):
            path = os.path.join(_ROOT, *info.name.split(".")) + ("/__init__.py" if info.ispkg else ".py")
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as f:
                source = f.read()
            if '__name__ == "__main__"' in source or info.name.endswith("__main__"):
                found.append(info.name)
    return sorted(found)


#: Fault-injection launchers the fault suite starts with positional arguments it builds itself; the
#: trainer's or server's flags they carry go to ``training.train``'s or ``inference.serve``'s own parser.
LAUNCHERS = {"experiments.faults.crash", "experiments.faults.dead", "experiments.faults.jobs",
             "experiments.faults.kill"}

COMMANDS = [m for m in _commands() if m not in LAUNCHERS]


def _help(module):
    """Run ``module``'s command with ``--help`` in this process; return the parsers it made."""
    mod = importlib.import_module(module)
    before = len(Parser.made)
    marker = object()
    Parser.made.append(marker)  # the parsers made from here on are this command's
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                mod.main(["--help"])
            except SystemExit as e:
                assert e.code in (0, None), f"{module} --help: exit {e.code}: {out.getvalue()[-500:]}"
    finally:
        pass
    made = Parser.made[Parser.made.index(marker) + 1:] if marker in Parser.made else Parser.made[before:]
    Parser.made[:] = [p for p in Parser.made if p is not marker]
    return [p for p in made if isinstance(p, Parser)]


def test_every_command_is_found():
    """The walk reaches the commands the documentation names (a guard against a discovery that finds none)."""
    for name in ("training.train", "inference.serve", "experiments.bench.checks", "experiments.faults.suite",
                 "experiments.studies.model_parallel_study", "experiments.studies.serving_study",
                 "experiments.studies.compression_sweep", "plots.ctr", "plots.predict", "training.predict.__main__"):
        assert name in COMMANDS, (name, COMMANDS)


@pytest.mark.parametrize("module", COMMANDS)
def test_every_option_of_every_command_refuses_values_outside_its_range(module, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    parsers = _help(module)
    capsys.readouterr()
    assert parsers, f"{module} builds no training.settings.options.Parser: its options declare no range"
    tried = 0
    for parser in parsers:
        assert not parser.undeclared(), (module, parser.undeclared())
        for action in parser._actions:
            kind = action.type
            edges = kind.edges() if isinstance(kind, Declared) else (["no-such-choice"] if action.choices else [])
            if isinstance(action.choices, dict):  # a subcommand's name: its own parser is walked
                continue
            name = action.option_strings[0] if action.option_strings else None
            for value in edges:
                argv = [name, value] if name else [value]
                with pytest.raises(SystemExit) as e:
                    parser.parse_args(argv)
                err = capsys.readouterr().err
                lines = [ln for ln in err.splitlines() if "error:" in ln]
                named = name or action.dest
                assert e.value.code == 2 and len(lines) == 1 and "Traceback" not in err and "usage:" not in err, (
                    module, argv, err)
                assert named in lines[0] or (action.metavar or "") in lines[0], (module, argv, lines[0])
                tried += 1
    assert not list(tmp_path.iterdir()), f"{module} wrote {list(tmp_path.iterdir())}"
    assert tried or all(not p.undeclared() for p in parsers)


def _refused(capsys, main, argv, flag):
    """Run a command's ``main(argv)`` in this process: exit 2 and one error line naming ``flag``; return it."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, err)
    assert flag in lines[0], (argv, lines[0])
    return lines[0]


@pytest.mark.parametrize("module, argv, flag", [
    ("training.train", ["--compression-arg", "ratio=0.1"], "--compression-arg"),
    ("training.train", ["--hidden", "100000000"], "--hidden"),
    ("training.train", ["--data", "synthetic", "--samples", "1000000000"], "--samples"),
    ("training.train", ["--samples", "1e12"], "--samples"),
    ("inference.serve", ["--checkpoint", "RUN", "--max-batch", "1e9"], "--max-batch"),
    ("inference.serve", ["--checkpoint", "RUN", "--requests", "1e12"], "--requests"),
    ("inference.serve", ["--checkpoint", "RUN", "--requests", "400000000"], "--requests"),
    ("experiments.bench.checks", ["--repeats", "0"], "--repeats"),
    ("experiments.bench.checks", ["--sizes", "-8"], "--sizes"),
    ("experiments.bench.checks", ["--algorithms", "bogus"], "--algorithms"),
    ("experiments.studies.model_parallel_study", ["--steps", "0"], "--steps"),
    ("experiments.studies.model_parallel_study", ["--hidden", "0"], "--hidden"),
    ("experiments.studies.model_parallel_study", ["--micro-batches", "3"], "--micro-batches"),
    ("experiments.studies.model_parallel_study", ["--rounds", "-1"], "--rounds"),
    ("experiments.studies.serving_study", ["--repeats", "0"], "--repeats"),
    ("experiments.studies.serving_study", ["--fractions", "-0.5"], "--fractions"),
    ("experiments.studies.compression_sweep", ["--seeds", "-1"], "--seeds"),
    ("experiments.faults.suite", ["--timeout", "0"], "--timeout"),
    ("training.emulator.emulate", ["--link", "1gbps", "--", "true"], "--link"),
    ("training.emulator.emulate", ["--uplink", "100mbps", "--", "true"], "--uplink"),
])
def test_listed_settings_are_refused_before_anything_runs(module, argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = _refused(capsys, importlib.import_module(module).main, argv, flag)
    assert line.endswith("(see --help)"), line
    assert not list(tmp_path.iterdir())


def test_a_rate_in_bytes_per_second_is_refused_with_the_rate_in_bits(capsys):
    from training.settings.options import link_rate

    with pytest.raises(Exception) as e:
        link_rate()("1gbps")
    assert "8gbit" in str(e.value) and "bytes per second" in str(e.value)
    assert link_rate()("100mbit") == "100mbit" and link_rate()("unlimited") == "unlimited"


@pytest.mark.parametrize("module", ["plots.ctr", "plots.predict"])
@pytest.mark.parametrize("content", [None, "garbage", "[1, 2]", '{"a": 1}', '{"points": 3, "best": {}}'])
def test_plots_on_a_missing_or_garbage_file_say_so_in_one_line(module, content, tmp_path, capsys):
    path = tmp_path / "r.json"
    if content is not None:
        path.write_text(content)
    line = _refused(capsys, importlib.import_module(module).main, [str(path), "--out", str(tmp_path / "o.png")],
                    str(path))
    assert not (tmp_path / "o.png").exists(), line


def test_a_parser_refuses_an_option_without_a_range():
    p = Parser(prog="demo")
    p.add_argument("--count", type=int)
    with pytest.raises(TypeError, match="--count"):
        p.parse_args([])
