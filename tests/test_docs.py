"""The documentation and the published results: the Sphinx site builds with no warning, the docstrings'
examples run at P = 1 under mpiexec, and every published table equals what the committed result files
give (oracle: ``plots.publish`` rendering them again)."""
import os
import shutil
import subprocess
import sys

from plots import publish
from tests.mpirun import ROOT, run_mpi


def test_docs_build_with_no_warning(tmp_path):
    sphinx = shutil.which("sphinx-build", path=os.path.dirname(sys.executable))
    assert sphinx, "sphinx-build is not installed: pip install -e '.[docs]'"
    res = subprocess.run([sphinx, "-q", "-W", "--keep-going", "-b", "html", "-d", str(tmp_path / "doctrees"),
                          "docs", str(tmp_path / "html")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "html" / "api.html").exists() and (tmp_path / "html" / "results.html").exists()


def test_docstring_examples_run_at_p1_under_mpiexec():
    res = run_mpi(1, "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--doctest-modules",
                  "collectives", "ps", "training", "inference", "plots", "experiments/results.py", timeout=120)
    import re

    passed = re.search(r"(\d+) passed", res.stdout)
    assert passed and "failed" not in res.stdout and "error" not in res.stdout, res.stdout
    assert int(passed.group(1)) >= 100, res.stdout  # every public module's examples were collected


def test_published_tables_equal_the_committed_result_files():
    problems = publish.check()
    assert problems == [], "\n".join(problems) + "\nrun `make results` (and commit) after changing a result file"


def test_a_hand_edited_published_number_fails_the_check():
    texts = {}
    for rel in ("README.md", "docs/results.md"):
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            texts[rel] = f.read()
    assert publish.blocks(texts["docs/results.md"]), "the results page publishes no block"
    text = texts["docs/results.md"]
    start = text.index("<!-- results:")
    digit = next(i for i in range(start, len(text)) if text[i].isdigit() and text[i - 1] in " |*(")
    edited = text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:]
    problems = publish.check({"docs/results.md": edited})
    assert len(problems) == 1 and "docs/results.md (from the committed result files)" in problems[0], problems
    missing = publish.check({"x.md": "![a figure](plots/figures/not_drawn.png)\n"})
    assert missing == ["x.md shows plots/figures/not_drawn.png, which no published item draws"]
