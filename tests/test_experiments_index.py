"""The experiments' index and harness: ``python -m experiments --list`` names every runnable module of
``experiments`` once, ``python -m experiments NAME ARGS`` runs it as ``python -m MODULE ARGS`` does, and
the harness writes a stamped results file only after its checks pass.

Oracles: the modules found by walking the package's files (every one that ends with the ``__main__``
guard), the module's own ``main`` run on the same arguments, and the results file read back.
"""
import json
import os
import subprocess
import sys

import pytest

from experiments import harness
from experiments.__main__ import index, main
from training.settings.options import Parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runnable_modules():
    found = set()
    for root, dirs, files in os.walk(os.path.join(ROOT, "experiments")):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for f in files:
            if f.endswith(".py") and not f.startswith("_"):
                with open(os.path.join(root, f), encoding="utf-8") as fh:
                    if 'if __name__ == "__main__"' in fh.read():
                        found.add(os.path.relpath(os.path.join(root, f[:-3]), ROOT).replace(os.sep, "."))
    return found


def test_list_names_every_runnable_module_once_with_one_line(capsys):
    found = index()
    assert {module for module, _ in found.values()} == _runnable_modules()
    assert all(module.rsplit(".", 1)[1] == name for name, (module, _) in found.items())
    assert main(["--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(found) and all(ln.split()[0] in found and len(ln.split()) > 1 for ln in lines)


def test_a_name_runs_its_module_and_an_unknown_name_is_refused(capsys):
    assert main(["tune", "--help"]) == 0
    assert "python -m experiments.bench.tune" in capsys.readouterr().out  # the module's own --help
    for argv in (["no_such_study"], []):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("error:") == 1 and ("no_such_study" in err or "NAME" in err), err
    proc = subprocess.run([sys.executable, "-m", "experiments", "scale_sim", "--no-such-flag"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 2 and "--no-such-flag" in proc.stdout and "Traceback" not in proc.stdout


def test_harness_checks_before_and_stamps_after(tmp_path, capsys):
    p = Parser(prog="python -m experiments.studies.example")
    harness.add_options(p, out=str(tmp_path / "r.json"), repeats=2)
    (tmp_path / "folder.json").mkdir()
    busy = p.parse_args(["--max-load", "-1"])
    assert harness.start(busy, paths=[busy.out]) is None
    assert "error: the 1-minute load average" in capsys.readouterr().err
    noisy = p.parse_args(["--allow-noisy"])  # a derived path that is a folder: refused before the load
    assert harness.start(noisy, paths=[str(tmp_path / "folder.json")], prog=p.prog) is None
    assert capsys.readouterr().err.startswith(f"{p.prog}: error: ") and not list((tmp_path / "folder.json").iterdir())
    args = p.parse_args(["--max-load", "1000", "--repeats", "3"])
    watch = harness.start(args, paths=[args.out])
    harness.finish({"rows": [args.repeats]}, watch, args.out, P=1, module="experiments.studies.example",
                   argv=["--repeats", "3"], show=lambda r: f"table of {r['rows']}")
    assert capsys.readouterr().out == f"table of [3]\nresults: {args.out}\n"
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["rows"] == [3] and record["provenance"]["noisy"] is False
    assert record["provenance"]["command"] == "python -m experiments.studies.example --repeats 3"
