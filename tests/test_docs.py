"""The documentation and the published results: the Sphinx site builds with no warning, the docstrings'
examples run at P = 1 under mpiexec, and every published table equals what the committed result files
give (oracle: ``plots.publish`` rendering them again)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from plots import publish
from tests.mpirun import ROOT, run_mpi


def test_docs_build_with_no_warning(tmp_path):
    sphinx = shutil.which("sphinx-build", path=os.path.dirname(sys.executable))
    assert sphinx, "sphinx-build is not installed: pip install -e '.[docs]'"
    res = subprocess.run([sphinx, "-q", "-W", "--keep-going", "-b", "html", "-d", str(tmp_path / "doctrees"),
                          "docs", str(tmp_path / "html")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "html" / "api.html").exists() and (tmp_path / "html" / "results.html").exists()
    # every figure links to its full-size PNG (the theme shrinks it to the text column)
    figures = unlinked = 0
    for page in (tmp_path / "html").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r'<img [^>]*src="([^"]*_images/[^"]+)"', text):
            figures += 1
            before = text[:m.start()].rstrip()
            href = re.search(r'<a [^>]*href="([^"]+)"[^>]*>$', before)
            if href is None or href.group(1) != m.group(1) or not (page.parent / href.group(1)).is_file():
                unlinked += 1
    assert figures >= 10 and unlinked == 0, f"{unlinked} of {figures} figures without a link to the full-size file"


def test_no_code_line_hides_a_comment_off_to_the_side():
    """In the docs' code blocks a line with a trailing comment fits the theme's code width (88
    characters); a longer one has its comment on its own line above, where a reader sees it."""
    long = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in sorted(f for f in files if f.endswith(".md") and "_build" not in dirpath):
            path = os.path.join(dirpath, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for body in re.findall(r"^```\w+\n(.*?)^```", text, flags=re.M | re.S):
                for line in body.splitlines():
                    m = re.match(r"^(\s*\S.*?)\s+#\s", line)
                    if m and len(line) > 88 and not (m.group(1).count('"') % 2 or m.group(1).count("'") % 2):
                        long.append(f"{os.path.relpath(path, ROOT)}: {line.strip()[:60]}...")
    assert not long, "comments off to the side of long code lines:\n" + "\n".join(long)


def test_docstring_examples_run_at_p1_under_mpiexec():
    res = run_mpi(1, "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--doctest-modules",
                  "collectives", "ps", "training", "inference", "plots", "commlab", "experiments/cluster",
                  timeout=120)
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


#: Phrases that tell the history of the code or of earlier measurements rather than what the software does
#: (issue 32's list): none may stand in the README, the docs, or a docstring or comment of the project.
HISTORY = (r"\bthis round\b", r"\blast round\b", r"\bprevious round\b", r"\blatest round\b", r"\bsince taken out\b",
           r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )\bused to\b", r"\btargets? met\b",
           r"\btargets? missed\b", r"\bwas being changed\b", r"\bearlier measurements?\b", r"\bpreviously\b")


_KEYS = ("this round", "last round", "previous round", "latest round", "since taken out", "used to", "target",
         "was being changed", "earlier measurement", "previously")  # a cheap test before the regular expression


def _history_hits(rel, text):
    import re

    lower = text.lower()
    if not any(key in lower for key in _KEYS):
        return []
    found = re.compile("|".join(HISTORY), re.IGNORECASE)
    return [f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}" for m in found.finditer(text)]


def test_documentation_tells_no_history():
    """Oracle: the phrase list. The README, the docs, and the docstrings and comments of every module are
    searched (a string a program prints is not documentation: a module with a hit is searched again in its
    comments and docstrings only)."""
    import ast
    import glob

    hits = []
    docs = ["README.md", *glob.glob("docs/**/*.md", root_dir=ROOT, recursive=True),
            *glob.glob("docs/**/*.rst", root_dir=ROOT, recursive=True)]
    for rel in docs:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            hits += _history_hits(rel, f.read())
    for package in ("collectives", "ps", "training", "inference", "experiments", "plots", "tests"):
        for rel in glob.glob(f"{package}/**/*.py", root_dir=ROOT, recursive=True):
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                source = f.read()
            if rel == "tests/test_docs.py" or not _history_hits(rel, source):
                continue
            comments = "\n".join(line.split("#", 1)[1] for line in source.splitlines() if "#" in line)
            strings = [ast.get_docstring(node) or "" for node in ast.walk(ast.parse(source))
                       if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            hits += _history_hits(rel + " (comments, docstrings)", "\n".join([comments, *strings]))
    assert hits == [], "\n".join(hits)
    assert _history_hits("x.md", "The ring used to be slower.") and not _history_hits("x.md", "It is used to sum.")


def test_an_item_whose_reference_is_not_committed_renders_nothing(monkeypatch):
    """``make results`` renders the items whose reference file is committed; one still waiting for its
    measurement is left out, and a document block naming it is an unknown item."""
    monkeypatch.setitem(publish.ITEMS, "not-measured", ("ps/not_measured.json", publish.ITEMS["ps-replicas"][1], None))
    tables = publish.render_tables()
    assert "not-measured" not in tables and "ps-replicas" in tables
    with pytest.raises(KeyError, match="not-measured"):
        publish.fill("<!-- results:not-measured -->\n<!-- /results:not-measured -->\n", tables)
