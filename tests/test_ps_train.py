"""Parameter-server training through the trainer's command line (``training.train --mode ps``).

* BSP equivalence: BSP on S servers + W workers with plain SGD in float64 ends with the same weights
  as data-parallel training on W ranks with the same global batch (relative tolerance 1e-9: the
  two runs differ only in the summation order of the gradient average).
* SSP(0) equivalence: SSP with staleness 0 ends with BSP's weights bitwise (Adam, float32).
* ``--fail-worker`` with a short ``--ps-timeout``: ASP finishes with the worker dropped; BSP exits
  1 with one error line naming the worker (no traceback, no abort). A hard timeout catches any hang.
* A crashed rank (``os._exit``, under ``mpiexec -disable-auto-cleanup`` so that MPICH does not end
  the others itself): every rank exits within ``--ps-timeout`` + 5 s of the crash (plus 2 s of slack
  for a loaded machine), the cause named once.
"""
import json
import os
import re
import time

import numpy as np
import pytest

from tests.mpirun import run_mpi

COMMON = ["--data", "digits", "--hidden", "32", "--epochs", "2", "--batch-size", "48", "--no-progress",
          "--threads", "1"]


def _train(P, tmp_path, name, *flags, check=True, timeout=90):
    out = run_mpi(P, "training.train", *COMMON, "--run-dir", str(tmp_path), "--name", name, *flags,
                  timeout=timeout, check=check)
    return out, os.path.join(str(tmp_path), name)


def test_bsp_matches_data_parallel_training(tmp_path):
    flags = ["--optimizer", "sgd", "--momentum", "0", "--lr", "0.1", "--dtype", "float64"]
    flags += ["--epochs", "1"]  # one epoch: ~37 steps, each an equal update, is what the equivalence needs
    _, dp = _train(3, tmp_path, "dp", "--mode", "dp", *flags)
    _, ps = _train(5, tmp_path, "ps", "--mode", "ps", "--servers", "2", "--consistency", "bsp", *flags)
    from training.runtime.checkpoint import checkpoint_path

    with np.load(checkpoint_path(dp, 1), allow_pickle=False) as z:
        want = z["model/params"]
    with np.load(os.path.join(ps, "ps_model.npz"), allow_pickle=False) as z:
        got = z["params"]
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    with open(os.path.join(ps, "summary.json")) as f:
        summary = json.load(f)
    assert summary["staleness_max"] == 0 and summary["worker_status"] == ["done"] * 3
    assert abs(summary["epochs"] - 1) < 1e-9


def test_ssp0_is_bsp_with_the_trainers_adam(tmp_path):
    """SSP with staleness 0 through the trainer (Adam, float32, cosine schedule, a jittery worker):
    the final weights equal BSP's bit for bit, since both serve the same reads and take one Adam
    step per clock on the same worker-ordered mean; the old one-step-per-push rule did not."""
    _, bsp = _train(5, tmp_path, "bsp", "--mode", "ps", "--consistency", "bsp", "--epochs", "1")
    _, ssp = _train(5, tmp_path, "ssp0", "--mode", "ps", "--consistency", "ssp", "--staleness", "0",
                    "--epochs", "1", "--jitter", "0.002")
    with np.load(os.path.join(bsp, "ps_model.npz"), allow_pickle=False) as a, \
            np.load(os.path.join(ssp, "ps_model.npz"), allow_pickle=False) as b:
        assert a["params"].dtype == np.float32 and np.array_equal(a["params"], b["params"])
    with open(os.path.join(ssp, "summary.json")) as f:
        summary = json.load(f)
    assert summary["staleness_max"] == 0 and summary["consistency"] == "ssp"


@pytest.mark.parametrize("consistency", ["asp", "bsp"])
def test_fail_worker_through_the_trainer(tmp_path, consistency):
    out, run_dir = _train(4, tmp_path, consistency, "--mode", "ps", "--consistency", consistency,
                          "--fail-worker", "3:4", "--ps-timeout", "1", check=False, timeout=60)
    if consistency == "bsp":
        assert out.returncode == 1, out.stdout  # one clean error line, no traceback, no MPI_Abort
        assert out.stdout.count("error: BSP cannot continue: worker rank 3") == 1, out.stdout
        assert "Traceback" not in out.stdout and "Abort" not in out.stdout, out.stdout
        return
    assert out.returncode == 0, out.stdout
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    assert summary["worker_status"] == ["done", "done", "dropped"]
    assert "worker rank 3 dropped" in out.stdout


#: ``--ps-timeout`` of the crash runs (seconds): every survivor must end within it + 5 s (+ 2 s slack)
CRASH_TIMEOUT = 1.5


def _crash(tmp_path, rank, call, *flags):
    """Run ``--mode ps --ps-timeout CRASH_TIMEOUT`` on 4 ranks with ``rank`` exiting at its ``call``-th protocol
    step; return (result, seconds from the crash to the end of the job)."""
    res = run_mpi(4, "experiments.faults.crash", "ps", rank, call, *COMMON, "--run-dir", str(tmp_path), "--mode", "ps",
                  "--ps-timeout", str(CRASH_TIMEOUT), *flags, timeout=60, check=False, mpiexec_args=("-disable-auto-cleanup",))
    end = time.time()
    crash = re.search(r"injected crash at ([0-9.]+)", res.stdout)
    assert crash, res.stdout
    return res, end - float(crash.group(1))


@pytest.mark.parametrize("consistency", ["bsp", "ssp"])
def test_crashed_worker_ends_every_rank(tmp_path, consistency):
    res, seconds = _crash(tmp_path, 3, 5, "--consistency", consistency)
    out = res.stdout
    assert res.returncode != 0 and seconds <= CRASH_TIMEOUT + 5 + 2, (res.returncode, seconds, out)
    cause = "error: BSP cannot continue: worker rank 3" if consistency == "bsp" else "worker rank 3 dropped"
    assert out.count(cause) == 1, out
    assert out.count("error: rank 0: rank(s) 3 did not reach the end of the run") == 1, out
    assert out.count("error:") == (2 if consistency == "bsp" else 1) and "Traceback" not in out, out


def test_crashed_server_ends_every_rank(tmp_path):
    res, seconds = _crash(tmp_path, 0, 20, "--servers", "1")
    out = res.stdout
    assert res.returncode != 0 and seconds <= CRASH_TIMEOUT + 5 + 2, (res.returncode, seconds, out)
    # a worker names the silent server once: no reply at all, or (when the server died between a
    # reply's header and its payload, which above the eager limit needs the sender alive, as with
    # Open MPI's shared memory) no payload
    silent = re.findall(r"no answer from server rank\(s\) \[0\]|waiting for payload of \w+ from rank 0", out)
    assert len(silent) == 1 and out.count("error:") == 1, out
    assert "Traceback" not in out, out
