"""commlab plots: results files into PNG figures and Markdown tables (drawing only; every number comes
from the file).

- The figure commands, one module each at the top of the package, run as
  ``python -m plots.NAME RESULTS... [--out FILE]``: :mod:`~plots.bench`, :mod:`~plots.cluster`,
  :mod:`~plots.compression`, :mod:`~plots.ctr`, :mod:`~plots.hetero`, :mod:`~plots.levels`,
  :mod:`~plots.model_parallel`, :mod:`~plots.non_iid`, :mod:`~plots.predict`, :mod:`~plots.scaling`,
  :mod:`~plots.serving`, :mod:`~plots.staleness`, :mod:`~plots.training`. Beside them, what they share:
  :mod:`plots.inputs` (reading a results file, one usage line when it is not one) and
  :mod:`plots.bench_figure` (the panels of a collectives sweep). A figure command imports only these
  two and :mod:`plots.tables`, never another command.
- :mod:`plots.tables`: the Markdown tables the studies print and the documents publish (no matplotlib).
- :mod:`plots.publish`: ``python -m plots.publish`` (``make results``) regenerates every published table
  and figure from the reference result files under ``plots/reference/`` into the documents' marked
  blocks and ``plots/figures/``; it may import everything above, and nothing imports it.

Below ``plots``: ``training`` (the command-line options, the predictor's at-scale table),
``collectives`` (the cost model a figure draws) and ``commlab`` (the quiet-machine rule, byte sizes);
``experiments`` imports the tables and figures, never the other way.
"""
