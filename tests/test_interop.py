"""PyTorch interoperability: DLPack tensors through every collective, the DDP hook, the optimizer wrapper.

The rank-side bodies and their oracles are in ``tests/mpi_interop.py``. PyTorch is in the ``test``
extra (the CPU build); without it these tests are skipped. The JAX example runs when JAX is installed.
"""
import importlib.util
import os
import subprocess
import sys

import pytest

from tests.mpirun import ROOT, run_mpi

torch = pytest.importorskip("torch")


def test_dlpack_collectives_on_three_ranks():
    """Torch tensors (float32/64, int32, bfloat16) in and out of every collective vs MPI's own."""
    result = run_mpi(3, "tests.mpi_interop", "dlpack", timeout=120)
    assert "0 failures on 3 ranks" in result.stdout


def test_ddp_hook_and_distributed_optimizer_on_two_ranks():
    """DDP with commlab_hook equals DDP's default hook; PowerSGD within 1 point of PyTorch's hook."""
    result = run_mpi(2, "tests.mpi_interop", "torch", timeout=240)
    assert "0 failures on 2 ranks" in result.stdout


def test_fp16_and_powersgd_equal_pytorchs_own_hooks_on_two_ranks():
    """fp16 equals fp16_compress_hook at the float16 edge (no Inf at 36,500 on 2 ranks); PowerSGD under DDP
    equals powerSGD_hook (float64, 1e-10) through the bucket rebuild; a rebuilt bucket keeps its state."""
    result = run_mpi(2, "tests.mpi_interop", "peers", timeout=240)
    assert "0 failures on 2 ranks" in result.stdout


def test_collectives_import_does_not_import_torch():
    """``import collectives`` (and its torch_hook module) leaves PyTorch unimported."""
    code = "import sys, collectives, collectives.interop.torch_hook; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed")
def test_jax_example_on_two_ranks():
    """The JAX example: gradients of a jax.grad step averaged by commlab equal the full-batch gradient."""
    result = run_mpi(2, "experiments.jax_example", "--steps", "3", timeout=240)
    assert "matches the full-batch gradient" in result.stdout


@pytest.mark.skipif(importlib.util.find_spec("jax") is not None, reason="JAX is installed: the example itself runs")
def test_jax_example_without_jax_prints_one_line_once():
    """A missing optional package: one line naming what to install, from one rank, no traceback."""
    result = run_mpi(2, "experiments.jax_example", "--steps", "3", timeout=60, check=False)
    assert result.returncode != 0, result.stdout
    assert result.stdout.count("error: the JAX example needs jax: pip install jax") == 1, result.stdout
    assert "Traceback" not in result.stdout and result.stdout.count("error:") == 1, result.stdout


def test_mpi_library_string_is_one_clean_line():
    """Open MPI's NUL terminator and MPICH's padding are removed; the library key names each."""
    from collectives.backend import mpi_library_key
    from commlab.provenance import mpi_library

    ompi = "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, repo rev: v5.0.11\x00"
    assert mpi_library(ompi) == ompi[:-1] and "\x00" not in mpi_library(ompi)
    assert mpi_library("MPICH Version:      5.0.2\nMPICH Release date: x\x00") == "MPICH Version: 5.0.2"
    assert mpi_library_key(ompi) == ("Open MPI", "5.0.11")
    assert mpi_library_key("MPICH Version:      5.0.2\n") == ("MPICH", "5.0.2")
    assert "\x00" not in mpi_library()


def test_tuning_tables_are_keyed_by_mpi_library(tmp_path, monkeypatch):
    """A table measured with MPICH is refused under Open MPI; each library loads its own shipped table."""
    import json

    from collectives.model import auto as select

    monkeypatch.setattr(select, "_STATE", dict(select._STATE, cache={}))
    with open(select.SHIPPED["MPICH"], encoding="utf-8") as f:
        assert select.table_library(json.load(f)) == "MPICH"
    monkeypatch.setattr(select, "_running_library", lambda: "Open MPI")
    with pytest.raises(ValueError, match="measured with MPICH, but this process runs Open MPI"):
        select.load_table(select.SHIPPED["MPICH"])
    select.load_table(select.SHIPPED["MPICH"], check_library=False)  # explicitly allowed
    assert select._STATE["source"] == select.SHIPPED["MPICH"]
    if os.path.exists(select.SHIPPED["Open MPI"]):
        with open(select.SHIPPED["Open MPI"], encoding="utf-8") as f:
            assert select.table_library(json.load(f)) == "Open MPI"
        select.load_table(select.SHIPPED["Open MPI"])
    monkeypatch.delenv("COMMLAB_TUNING", raising=False)
    select._STATE.update(loaded=False, rules=None, source=None, cache={})
    select._ensure_loaded()  # under "Open MPI": never MPICH's table
    assert select._STATE["source"] in (select.SHIPPED["Open MPI"], None)
    assert select._STATE["source"] != select.SHIPPED["MPICH"]
