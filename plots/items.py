"""The published items: each reference result file under ``plots/reference/``, the table it renders
into the documents' marked blocks and the figures it draws (:data:`ITEMS`, read by :mod:`plots.publish`).

The renderers of single studies live in :mod:`plots.renderers`; a study whose ``plots`` module renders
its own table and figure is named here through :func:`_module_table` and :func:`_figure`. Every renderer
loads its file, refuses one measured on a busy machine and ends its table with the file's provenance
(:mod:`plots.sources`).
"""
import os

from plots.hetero import published_figures as _hetero_figures, published_table as _hetero_table
from plots.renderers import (_bench, _bench_figures, _breakdown_table, _levels_table, _metrics_overhead_table,
                             _mpi_baseline_table,
                             _model_parallel_table, _non_iid_figures, _non_iid_table, _ps_part, _replicas_table,
                             _scaling_table, _serving_load_figure, _serving_load_table, _small_calls,
                             _trainer_table, _training_figures, _training_table)
from plots.sources import FIGURES, REFERENCE, ROOT, check_quiet, load as _load, source_line

__all__ = ["ITEMS", "ROOT", "REFERENCE", "FIGURES", "check_quiet", "source_line"]


def _figure(module, name, func="draw"):
    """Return an item's figure drawer: ``plots.MODULE.FUNC(result, out)`` into ``plots/figures/NAME``."""
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
    "bench-p2": ("bench/collectives_p2.json", _bench, _bench_figures),
    "training": ("training/default_p4", _training_table, _training_figures),
    "scaling": ("scaling/scale_sim.json", _scaling_table, _figure("scaling", "scaling.png")),
    "trainer-vs-pytorch": ("bench/trainer_vs_pytorch.json", _trainer_table, None),
    "model-parallel-p4": ("model_parallel/p4.json", _model_parallel_table,
                          _figure("model_parallel", "model_parallel_p4.png")),
    "bench-breakdown-p2": ("bench/breakdown_p2.json", _breakdown_table, None),
    "bench-breakdown-p4": ("bench/breakdown_p4.json", _breakdown_table, None),
    "bench-breakdown-rs-p2": ("bench/breakdown_rs_p2.json", _breakdown_table, None),
    "bench-small-p2": ("bench/small_calls_p2.json", _small_calls, None),
    "serving-load": ("serving/load_sweep.json", _serving_load_table, _serving_load_figure),
    "ps-replicas": ("ps/replicas.json", _replicas_table, None),
    "ps-replicas-openmpi": ("ps/replicas_openmpi.json", _replicas_table, None),
    "metrics-overhead": ("bench/metrics_overhead_p4.json", _metrics_overhead_table, None),
    "bench-small-p4": ("bench/small_calls_p4.json", _small_calls, None),
    "ps-conflict": ("ps/conflict_retries.json", _ps_part("conflict"), None),
    "ps-retries": ("ps/conflict_retries.json", _ps_part("retries"), None),
    "non-iid": ("non_iid", _non_iid_table, _non_iid_figures),
    "hetero": ("hetero", _hetero_table, _hetero_figures),
    "cluster-levels": ("cluster/levels.json", _levels_table, _figure("levels", "cluster_levels.png")),
    "predict-validation": ("predict/validation.json", _module_table("predict", "validation_table"),
                           _figure("predict", "predict_validation.png", "draw_validation")),
    "predict-scale": ("predict/scale.json", _module_table("predict", "scale_markdown"),
                      _figure("predict", "predict_scale.png")),
    "ctr-study": ("cluster/ctr_study.json", _module_table("ctr", "markdown"), _figure("ctr", "ctr_study.png")),
    "ctr-hotkeys": ("ctr/hotkeys.json", _module_table("ctr", "hotkeys_markdown"), None),
    "bench-mpi-baseline-p2": ("bench/mpi_baseline_p2.json", _mpi_baseline_table, None),
    "cluster-compression": ("cluster/compression_study.json", _module_table("cluster_tables", "compression_markdown"),
                            _figure("cluster", "cluster_compression.png", "draw_compression")),
    "cluster-ps": ("cluster/ps_study.json", _module_table("cluster_tables", "ps_markdown"),
                   _figure("cluster", "cluster_ps.png", "draw_ps")),
    "cluster-collectives": ("cluster/collectives_study.json", _module_table("cluster_tables", "collectives_markdown"),
                            _figure("cluster", "cluster_collectives.png")),
}
