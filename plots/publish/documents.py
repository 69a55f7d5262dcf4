"""The documents' marked result blocks: find them, fill them from the published items, and check them.

``python -m plots.publish`` (``make results``, :mod:`plots.publish.__main__`) reads the reference result files under
``plots/reference/`` (each written by a study or benchmark with its provenance: command, versions, P,
cores, load before and during; see :mod:`commlab.provenance`), redraws the figures into
``plots/figures/`` and rewrites every marked table block of ``README.md`` and ``docs/*.md``::

    <!-- results:NAME -->
    ...generated text...
    <!-- /results:NAME -->

``python -m plots.publish --check`` changes nothing: it exits 1 and prints a diff when a marked block
differs from what the committed files give (a block of an item whose file is not committed must be
empty), when a block names no known item, or when a figure the documents show is drawn by no item (the test suite runs this check, so no published number can go
stale without a failing test). A reference file measured on a busy machine (``noisy``, or without
provenance) is refused (:func:`plots.publish.sources.check_quiet`).

Examples
--------
>>> from plots.publish.documents import fill
>>> text = "a\\n<!-- results:x -->\\nold\\n<!-- /results:x -->\\nb\\n"
>>> print(fill(text, {"x": "new"}), end="")
a
<!-- results:x -->
new
<!-- /results:x -->
b
"""
import difflib
import glob
import os
import re

from plots.publish.items import ITEMS, figure_names
from plots.publish.sources import REFERENCE, ROOT

__all__ = ["DOCUMENTS", "fill", "blocks", "render_tables", "draw_figures", "documents", "check"]

#: The documents whose marked blocks and figures are published.
DOCUMENTS = ("README.md", "docs/*.md", "docs/*/*.md")
_BLOCK = re.compile(r"(<!-- results:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


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
    """Return {item name: generated text} for the items that publish a table: those in ``names``, or
    (``names`` None) every item whose reference file is committed. An item of ``names`` whose reference
    is not committed renders as empty text: its blocks stay empty until the study's file is committed."""
    tables = {}
    for n, (ref, render, _) in ITEMS.items():
        committed = os.path.exists(os.path.join(REFERENCE, ref))
        if render and (n in names if names is not None else committed):
            tables[n] = render(ref) if committed else ""
    return tables


def draw_figures():
    """Draw every item's figures into ``plots/figures/``; return their paths."""
    paths = []
    for ref, _, draw in ITEMS.values():
        if draw and os.path.exists(os.path.join(REFERENCE, ref)):
            paths += draw(ref)
    return paths


def documents():
    """Return the paths of the documents whose marked blocks are published (:data:`DOCUMENTS`), sorted."""
    return sorted({p for pattern in DOCUMENTS for p in glob.glob(os.path.join(ROOT, pattern))})


def _shown_figures(text):
    return set(re.findall(r"plots/figures/([\w.-]+\.png)", text))


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
        for path in documents():
            with open(path, encoding="utf-8") as f:
                texts[os.path.relpath(path, ROOT)] = f.read()
    problems = []
    names = {n for text in texts.values() for n in blocks(text)}
    unknown = sorted(names - set(ITEMS))
    problems += [f"a results block names no item: {n} (known: {', '.join(ITEMS)})" for n in unknown]
    tables = render_tables(names - set(unknown))
    tables.update({n: f"<!-- results:{n} is unknown -->" for n in unknown})
    drawn = figure_names()
    for rel, text in texts.items():
        want = fill(text, tables)
        if want != text and not unknown:
            diff = difflib.unified_diff(text.splitlines(), want.splitlines(), f"{rel} (as written)",
                                        f"{rel} (from the committed result files)", lineterm="", n=1)
            problems.append("\n".join(diff))
        problems += [f"{rel} shows plots/figures/{f}, which no published item draws" for f in
                     sorted(_shown_figures(text) - drawn)]
    return problems
