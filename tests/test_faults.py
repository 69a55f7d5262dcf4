"""The quick part of the fault-and-mismatch suite, and single-process checks of its building blocks.

Oracle: each mismatch case has a right value (NumPy) or must raise on every rank; the suite counts
silent wrong answers and hangs (hard limits), and this test requires zero of each.
"""
import json
import subprocess
import sys

import numpy as np
import pytest

from collectives.library import call as library
from collectives.engine.fingerprint import TagSpace, describe, key_code
from tests.mpirun import ROOT


def test_quick_fault_suite_has_no_silent_wrong_answer_and_no_hang(tmp_path):
    out = tmp_path / "faults.json"
    proc = subprocess.run([sys.executable, "-m", "experiments.faults.suite", "--part", "quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=400)
    totals = json.loads(out.read_text())["totals"]
    assert totals["silent_wrong"] == 0 and totals["hangs"] == 0 and totals["other"] == 0, proc.stdout
    assert totals["passed"] + totals["expected_silent"] == totals["cases"], proc.stdout
    results = json.loads(out.read_text())["results"]
    from experiments.faults.checkpoints import KINDS, PS_KINDS, SHARDED_KINDS

    for prefix, kinds in (("checkpoint/", KINDS), ("ps_checkpoint/", PS_KINDS),  # the three checkpoint formats
                          ("sharded_checkpoint/", SHARDED_KINDS)):
        damaged = [r for r in results if r["case"].startswith(prefix)]
        assert len(damaged) == len(kinds) and all(r["verdict"] == "pass" for r in damaged), damaged
    from experiments.faults import option_cases, records

    for prefix, names in (("options/", option_cases.QUICK), ("records/", records.QUICK)):  # the trainer's own cases
        found = [r for r in results if r["case"].startswith(prefix)]
        assert sorted(r["case"] for r in found) == sorted(prefix + n for n in names), found
        assert all(r["verdict"] == "pass" for r in found), found
    strict = [r for r in results if r["mode"] == "strict" and r["case"].startswith("extra_call/")]
    assert strict and all(r["verdict"] == "pass" for r in strict)  # the call site catches the extra call
    # the library path: a dtype of another element size is a mismatch on every rank (the check follows
    # the call there; docs/guide/collectives.md), not a timeout or a lost peer
    dtype = [r for r in results if r["case"] == "dtype/mpi"]
    assert len(dtype) == 2 and all(e.startswith("CollectiveMismatch") for r in dtype for e in r["errors"]), dtype
    count = [r for r in results if r["mode"] == "strict" and r["case"] == "count/ring"][0]
    assert any("count" in e and "rank 0: count=10" in e for e in count["errors"]), count
    # all-gather into out=: blocks of 6 elements shaped (2, 3) on rank 0 and (3, 2) elsewhere must raise
    shaped = [r for r in results if r["case"].startswith("allgather_out_shape/")]
    assert len(shaped) == 4 and all(r["verdict"] == "pass" for r in shaped), shaped
    assert all("rank 0: block shape=(2, 3)" in " ".join(r["errors"]) for r in shaped if r["mode"] == "strict")


_LR = "error: the ranks were started with different settings (every rank must run the same job): --lr: rank 0: 0.1"


@pytest.mark.parametrize("statuses, text, made, verdict", [
    ([1, 1], f"{_LR}\n", False, "pass"),
    ([1, 0], f"{_LR}\n", False, "silent-wrong"),  # a rank trained
    ([1, 1], f"{_LR}\n{_LR}\n", False, "unclear"),  # one line, not one per rank
    ([1, 1], "error: the model differs across ranks (same --hidden)\n", False, "unclear"),  # another option
    ([1, 1], f"Traceback (most recent call last):\n{_LR}\n", False, "unclear"),
    ([1, 1], f"{_LR}\n", True, "unclear"),  # a run directory was made
    ([2], "", False, "unclear")])
def test_a_job_of_ranks_with_different_options_passes_only_on_one_line_naming_the_option(statuses, text, made,
                                                                                        verdict):
    from experiments.faults.option_cases import verdict as option_verdict

    assert option_verdict("lr", 2, statuses, text, made)[0] == verdict


def _restart(status=0, output="", same=True, epochs=(1, 2, 3), leftovers=()):
    rec = {"status": status, "output": output}
    return rec if status else {**rec, "same": same, "epochs": list(epochs), "leftovers": list(leftovers)}


@pytest.mark.parametrize("kind, recs, verdict", [
    ("torn-epochs-line", [_restart(output="WARNING: r/epochs.jsonl: dropped its torn last line 3 (x)"), _restart()],
     "pass"),
    ("torn-epochs-line", [_restart(), _restart()], "unclear"),  # dropped without a warning naming the file
    ("config-temporary", [_restart(same=False), _restart()], "silent-wrong"),
    ("config-temporary", [_restart(epochs=(1, 2, 2, 3)), _restart()], "silent-wrong"),  # an epoch twice
    ("config-temporary", [_restart(leftovers=["config.json.tmp.7"]), _restart()], "unclear"),
    ("config-temporary", [_restart(1, "error: cannot resume\n"), _restart(1)], "data-lost"),
    ("truncated-config", [_restart(1, "error: --resume r: cannot read r/config.json (x)\n"), _restart(1)], "pass"),
    ("truncated-config", [_restart(1, "Traceback (most recent call last):\nerror: r/config.json\n"),
                          _restart(1)], "crash")])
def test_a_restarted_run_passes_with_the_uninterrupted_result_or_an_error_naming_the_file(kind, recs, verdict):
    from experiments.faults.records import verdict as record_verdict

    assert record_verdict(kind, dict(enumerate(recs)))[0] == verdict


def test_the_guide_counts_the_suites_option_and_record_cases():
    import os

    from experiments.faults.option_cases import OPTIONS
    from experiments.faults.records import QUICK, RECORD_KINDS

    with open(os.path.join(ROOT, "docs", "guide", "collectives.md"), encoding="utf-8") as f:
        text = " ".join(f.read().split())
    assert f"{len(OPTIONS)} options" in text and f"{len(RECORD_KINDS)} torn-record kinds" in text
    assert f"{len(QUICK)} of these {len(RECORD_KINDS)} kinds" in text


def test_tags_of_different_calls_differ_and_fit_the_tag_range():
    space = TagSpace(536870911)
    a = ("allreduce", "ring", 8, np.dtype("float32"), "sum", None, None)
    b = ("allreduce", "ring", 10, np.dtype("float32"), "sum", None, None)
    assert space.tag(a, 1) != space.tag(b, 1) and space.tag(a, 1) != space.tag(a, 2)
    assert all(0 <= space.tag(k, s) <= 536870911 for k in (a, b) for s in (1, 4095, 4096, 10 ** 6))
    small = TagSpace(32767)
    assert all(0 <= small.tag(a, s) <= 32767 for s in range(300))
    assert describe(a) == "allreduce(count=8, dtype=float32, op=sum, algorithm=ring)"


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64"])
@pytest.mark.parametrize("op", ["sum", "avg", "min", "max", "prod"])
@pytest.mark.parametrize("P", [1, 2, 3, 7, 32, 33])
def test_inline_check_accepts_equal_keys_and_refuses_others(op, P, dtype):
    ufunc = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}[op]
    key = ("allreduce", "mpi", 4, np.dtype(dtype), op, None, None)
    tails = []
    for k in [key] * P:
        t = np.empty(library.CHECK_ELEMENTS, dtype)
        library.encode_check(t, k, P)
        tails.append(t)
    library.verify_check(ufunc.reduce(tails, dtype=dtype), key, P)  # equal keys: accepted (NumPy's reduction)
    # a key whose check digits (prod: 16 bits, 8 above 32 ranks) differ, on any one rank: refused by every rank
    others = [("allreduce", "mpi", n, np.dtype(dtype), op, None, None) for n in range(5, 400)]
    bits = (0xFFFF if P <= 32 else 0xFF) if op == "prod" else 0xFFFFFFFF
    other = next(k for k in others if key_code(k) & bits != key_code(key) & bits)
    for odd in range(P if P > 1 else 0):  # rank `odd` called `other`: the reduction refuted on every rank
        reduced = ufunc.reduce([_tail_of(other if i == odd else key, P, dtype) for i in range(P)], dtype=dtype)
        for mine in (key, other):
            with pytest.raises(Exception, match="disagree"):
                library.verify_check(reduced, mine, P)


def _tail_of(key, P, dtype):
    t = np.empty(library.CHECK_ELEMENTS, dtype)
    library.encode_check(t, key, P)
    return t


def test_launch_options_are_translated_for_open_mpi_only(monkeypatch):
    from experiments.faults import suite as fault_suite

    monkeypatch.setattr(fault_suite, "flavour", lambda path: "mpich")
    assert fault_suite._launcher(["-disable-auto-cleanup"]) == ({}, ["-disable-auto-cleanup"])
    monkeypatch.setattr(fault_suite, "flavour", lambda path: "openmpi")
    monkeypatch.setenv("OMPI_MCA_smsc", "^cma,xpmem")  # a value already set is kept
    env, args = fault_suite._launcher(["-disable-auto-cleanup", "-v"])
    assert args == ["--enable-recovery", "-v"]
    assert env["OMPI_MCA_smsc"] == "^cma,xpmem" and env["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"


@pytest.mark.parametrize("code, out, failed", [
    (1, "", True), (None, "", False), (0, "", False),
    (0, "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n  Errorcode: 1\n", True),
    (0, "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD\n  Errorcode: 0\n", False)])
def test_a_job_fails_by_its_status_or_by_open_mpis_abort_report(code, out, failed):
    from experiments.faults.suite import _failed

    assert _failed(code, out) is failed


def test_a_launcher_left_alone_after_its_ranks_ended_is_stopped(tmp_path, monkeypatch):
    """A stand-in launcher starts one short-lived 'rank' and then never exits, as Open MPI 5.0.11's
    prterun --enable-recovery sometimes does after every rank ended: the suite stops it about
    LAUNCHER_ALONE_S after the rank ended (status 0, the seconds up to then), not at the hard limit;
    without a dead rank expected it waits for the limit and reports a hang (None)."""
    import time

    from experiments.faults import suite as fault_suite

    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/sh\nwhile [ "$1" != "-n" ]; do shift; done\n'
                    '"$3" -c "import time; time.sleep(0.5)" &\nexec sleep 120\n')
    fake.chmod(0o755)
    monkeypatch.setattr(fault_suite, "default_mpiexec", lambda: str(fake))
    monkeypatch.setattr(fault_suite, "_launcher", lambda extra: ({}, list(extra)))
    monkeypatch.setattr(fault_suite, "LAUNCHER_ALONE_S", 1.0)
    begin = time.perf_counter()
    code, secs, out = fault_suite._launch(1, "x", [], {}, 60, extra=("-disable-auto-cleanup",))
    assert code == 0 and 0.25 < secs < 5 and "still running 1 s" in out, (code, secs, out)
    assert time.perf_counter() - begin < 20
    code, secs, out = fault_suite._launch(1, "x", [], {}, 1.5)
    assert code is None and secs >= 1.5, (code, secs, out)


def test_jobs_killed_at_random_moments_restart_to_the_uninterrupted_result():
    """Three kills (SIGKILL to launcher and ranks) of a small 2-rank job at random moments, the second
    aimed at a checkpoint write, each restarted as documented (--resume, or the same --name when the
    job died before its configuration): every restarted run ends with the uninterrupted run's
    parameters, bit for bit (the full part runs more)."""
    from experiments.faults.suite import run_kill_resume

    results = run_kill_resume(3, 60, seed=3, small=True)
    assert [r["verdict"] for r in results] == ["pass"] * 3, results
    assert [r["aimed_at_save"] for r in results] == [False, True, False], results


@pytest.mark.parametrize("error_class, lost", [("ERR_OTHER", True), ("ERR_INTERN", True), ("ERR_TRUNCATE", False),
                                               ("ERR_COUNT", False)])
def test_a_failed_transfer_is_a_lost_peer_and_a_truncated_message_a_mismatch(error_class, lost):
    """The MPI library's error, as the hand-made path (a round's peer named) and the library path
    (no peer of its own) read it: only a message that did not fit says the ranks' calls differ."""
    from mpi4py import MPI

    from collectives.engine.executor import Run
    from collectives.errors import CollectiveMismatch, PeerLost
    from collectives.schedules.ring import ring_allreduce

    exc = MPI.Exception(getattr(MPI, error_class))
    run = Run(ring_allreduce(0, 2, 4), MPI.COMM_SELF, np.zeros(4), scratch=np.zeros(4), ufunc=np.add, name="allreduce")
    mine = run.failed(0, exc)
    key = ("allreduce", "mpi", 4, np.dtype("float32"), "sum", None, None)
    theirs = library.library_error(key, exc, (), "MPI_Iallreduce")
    if lost:
        assert type(mine) is PeerLost and mine.peer == 1 and "allreduce lost rank 1 in round 0" in str(mine), mine
        assert type(theirs) is PeerLost and "lost a peer (inside the MPI library)" in str(theirs), theirs
    else:
        assert type(mine) is CollectiveMismatch and "with rank 1" in str(mine), mine
        assert type(theirs) is CollectiveMismatch and "calls differ" in str(theirs), theirs
