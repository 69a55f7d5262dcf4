"""Publish results as code: every table and figure of the README and the docs, from committed result files.

``python -m plots.publish`` (``make results``) redraws the figures into ``plots/figures/`` and rewrites
every marked table block of ``README.md`` and ``docs/*.md`` from the reference result files under
``plots/reference/``; ``python -m plots.publish --check`` changes nothing and exits 1 with a diff when
a block differs from what the committed files give (:func:`plots.publish.documents.check`).
"""
import os
import sys

from plots.publish.documents import check, documents, draw_figures, fill, render_tables
from plots.publish.items import ITEMS
from plots.publish.sources import ROOT
from training.settings.options import Parser

__all__ = ["main"]


def main(argv=None):
    """Regenerate (default) or check (``--check``) every published table and figure."""
    p = Parser(prog="python -m plots.publish", description=__doc__.split("\n\n")[0])
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
        tables = render_tables(set(ITEMS))
        for path in documents():
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
