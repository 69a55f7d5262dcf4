"""The published items: each reference result file under ``plots/reference/``, the table it renders
into the documents' marked blocks and the figures it draws (:data:`ITEMS`, read by
:mod:`plots.publish.documents`).

The renderers of single studies live in :mod:`plots.publish.renderers`; a study whose ``plots`` module
renders its own table and figure is named here through :func:`_module_table` and :func:`_figure`. Every
renderer loads its file, refuses one measured on a busy machine and ends its table with the file's
provenance (:mod:`plots.publish.sources`).
"""
import os

from plots.publish.renderers import (draw_bench, draw_hetero, draw_non_iid, draw_serving_load, draw_training,
                                     render_bench, render_breakdown, render_hetero, render_levels,
                                     render_metrics_overhead, render_model_parallel, render_mpi_baseline,
                                     render_non_iid, render_ps_part, render_replicas, render_scaling,
                                     render_serving_load, render_small_calls, render_trainer, render_training)
from plots.publish.sources import FIGURES, check_quiet, load as _load, source_line

__all__ = ["ITEMS"]


def _figure(module, name, func="draw"):
    """Return an item's figure drawer: ``plots.MODULE.FUNC(result, out)`` into ``plots/figures/NAME``
    (``MODULE`` relative to ``plots``: a figure command, or ``tables.NAME``)."""
    def draw_figure(rel):
        import importlib

        result = _load(rel)
        check_quiet(result, rel)
        out = os.path.join(FIGURES, name)
        getattr(importlib.import_module(f"plots.{module}"), func)(result, out)
        return [out]
    return draw_figure


def _module_table(module, func, launches_itself=True):
    """Return an item's table renderer: ``plots.MODULE.FUNC(result)`` followed by the file's provenance."""
    def table(rel):
        import importlib

        result = _load(rel)
        prov = check_quiet(result, rel)
        return getattr(importlib.import_module(f"plots.{module}"), func)(result) + "\n\n" + source_line(
            prov, rel, launches_itself)
    return table


#: name -> (reference file or folder under plots/reference/, table renderer or None, figure drawer or None);
#: an item whose reference is not committed yet draws nothing, and its blocks must be empty until it is.
ITEMS = {
    "bench-p2": ("bench/collectives_p2.json", render_bench, draw_bench),
    "training": ("training/default_p4", render_training, draw_training),
    "scaling": ("scaling/scale_sim.json", render_scaling, _figure("scaling", "scaling.png")),
    "trainer-vs-pytorch": ("bench/trainer_vs_pytorch.json", render_trainer, None),
    "model-parallel-p4": ("model_parallel/p4.json", render_model_parallel,
                          _figure("model_parallel", "model_parallel_p4.png")),
    "bench-breakdown-p2": ("bench/breakdown_p2.json", render_breakdown, None),
    "bench-breakdown-p4": ("bench/breakdown_p4.json", render_breakdown, None),
    "bench-breakdown-rs-p2": ("bench/breakdown_rs_p2.json", render_breakdown, None),
    "bench-small-p2": ("bench/small_calls_p2.json", render_small_calls, None),
    "serving-load": ("serving/load_sweep.json", render_serving_load, draw_serving_load),
    "ps-replicas": ("ps/replicas.json", render_replicas, None),
    "ps-replicas-openmpi": ("ps/replicas_openmpi.json", render_replicas, None),
    "metrics-overhead": ("bench/metrics_overhead_p4.json", render_metrics_overhead, None),
    "bench-small-p4": ("bench/small_calls_p4.json", render_small_calls, None),
    "ps-conflict": ("ps/conflict_retries.json", render_ps_part("conflict"), None),
    "ps-retries": ("ps/conflict_retries.json", render_ps_part("retries"), None),
    "non-iid": ("non_iid", render_non_iid, draw_non_iid),
    "hetero": ("hetero", render_hetero, draw_hetero),
    "cluster-levels": ("cluster/levels.json", render_levels, _figure("levels", "cluster_levels.png")),
    "predict-validation": ("predict/validation.json", _module_table("predict", "validation_table"),
                           _figure("predict", "predict_validation.png", "draw_validation")),
    "predict-scale": ("predict/scale.json", _module_table("predict", "scale_markdown"),
                      _figure("predict", "predict_scale.png")),
    "ctr-study": ("cluster/ctr_study.json", _module_table("ctr", "markdown"), _figure("ctr", "ctr_study.png")),
    "ctr-hotkeys": ("ctr/hotkeys.json", _module_table("ctr", "hotkeys_markdown"), None),
    "bench-mpi-baseline-p2": ("bench/mpi_baseline_p2.json", render_mpi_baseline, None),
    "cluster-compression": ("cluster/compression_study.json", _module_table("tables.cluster_tables", "compression_markdown"),
                            _figure("cluster", "cluster_compression.png", "draw_compression")),
    "cluster-ps": ("cluster/ps_study.json", _module_table("tables.cluster_tables", "ps_markdown"),
                   _figure("cluster", "cluster_ps.png", "draw_ps")),
    "cluster-collectives": ("cluster/collectives_study.json", _module_table("tables.cluster_tables", "collectives_markdown"),
                            _figure("cluster", "cluster_collectives.png")),
}
