"""Publishing: every table and figure the README and the docs show, regenerated from committed result files.

- :mod:`plots.publish.sources`: the reference result files under ``plots/reference/``, the refusal of a
  file measured on a busy machine, and the provenance line that ends every published table;
- :mod:`plots.publish.items`: the published items (:data:`~plots.publish.items.ITEMS`: reference
  file, table, figures) and each one's table renderer and figure drawer;
- :mod:`plots.publish.documents`: the documents' marked blocks, filled and checked;
- ``python -m plots.publish`` (:mod:`plots.publish.__main__`, ``make results``) rewrites them, and
  ``--check`` compares them.

May import the figure commands of :mod:`plots` (their drawings and tables), :mod:`plots.tables`, and
the packages below ``plots`` (``training``, ``collectives``); nothing in ``plots`` imports it.
"""
from .documents import blocks, check, draw_figures, fill, render_tables
from .items import ITEMS

__all__ = ["ITEMS", "blocks", "check", "draw_figures", "fill", "render_tables"]
