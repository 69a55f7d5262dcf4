"""The fault-and-mismatch suite: every ordinary mistake and fault, under mpiexec, with totals.

``python -m experiments.faults.suite [--part quick|full]`` (run it with plain ``python``: it launches
``mpiexec`` itself, each job under a hard time limit) runs the mismatch matrix of
:mod:`experiments.faults.collective_cases` -- each kind x every algorithm -- in each checking mode:

* ``default``: the free checks (fingerprint in the message tags, received sizes, the fingerprint in
  the MPI library path), with ``timeout=`` on every call;
* ``detail``: ``COMMLAB_DEBUG=detail``, the all-gathered fingerprint before every call;
* ``strict``: ``COMMLAB_DEBUG=strict``, the same plus the call site (file and line);
* ``detail-no-timeout`` (full part): debug mode with no timeout at all, where only what the
  fingerprint exchange catches may end a case;

then the damaged checkpoints (:mod:`experiments.faults.checkpoints`: every way a data-parallel
checkpoint, a parameter server's shard file or a model-parallel run's sharded checkpoint is damaged,
copied from another run, another server or epoch, or renamed, loaded by the trainer's own path), then
the trainer's own cases (:mod:`experiments.faults.jobs`: ranks of one job started with different
options, run directories with torn records restarted as documented), then (full part) the dead-rank
cases (a rank exits before a collective, under ``mpiexec -disable-auto-cleanup``; the survivors must
end the job through :func:`collectives.engine.policy.abort_on_failure` within timeout + 5 s), the
training crashes (:func:`run_crashes`: a data-parallel rank, a PS worker under BSP and SSP, a PS
server) and the kill-and-resume trials (:func:`run_kill_resume`). It runs
under MPICH's or Open MPI's ``mpiexec``, whichever sits beside ``python`` (:func:`_launcher` gives
Open MPI its options; a rank dies by ``SIGKILL`` there: :func:`experiments.faults.dead.vanish`). It
prints one line per case that is not a pass and the totals: cases, passed, hangs, silent wrong
answers, data lost. A case passes when every rank either returns the right value or raises; a
*silent wrong answer* is a rank that returned anything else; a *hang* is a job killed at its hard
limit.
Results go to ``--out`` (JSON). Exit status 1 when a target is missed: any silent wrong answer
outside the ones no fingerprint can see (listed as expected), or any hang where a timeout was set.
"""
import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from training.emulator.launch import OPENMPI_ENV, default_mpiexec, flavour
from experiments.faults.checkpoints import run_checkpoint_cases, run_ps_checkpoint_cases, run_sharded_checkpoint_cases
from experiments.faults.jobs import read_records, run_job_part
from commlab.job_control import job_processes, marked_env, stop_job
from training.settings.options import INT32_MAX, Parser, integer, outpath, real

__all__ = ["run_matrix", "run_dead", "run_crashes", "run_kill_resume", "launch", "main"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Cases no fingerprint of the call's fields can tell apart (one rank makes an extra call of the same
#: shape): only the call site (``strict``) sees them. Without a timeout the rank that made the extra
#: call then waits forever for a partner: counted as an expected hang, not a missed target.
UNDETECTABLE = {("default", "extra_call"), ("detail", "extra_call"), ("detail-no-timeout", "extra_call")}


def _launcher(extra):
    """Return (environment, options) of a launch: ``extra`` as MPICH takes it, translated for Open MPI.

    Open MPI 5 (PRRTE) is told to allow more ranks than cores and root, and to leave out its
    ``smsc/cma`` component (a truncated large ``MPI_Iallreduce``, which mismatched calls make,
    corrupts the receiver's memory with it: see the README); MPICH's ``-disable-auto-cleanup``
    becomes ``--enable-recovery``. Values already in the environment are kept.
    """
    if flavour(default_mpiexec()) != "openmpi":
        return {}, list(extra)
    env = {**OPENMPI_ENV, "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe", "OMPI_MCA_smsc": "^cma"}
    env = {k: os.environ.get(k, v) for k, v in env.items()}
    return env, ["--enable-recovery" if a == "-disable-auto-cleanup" else a for a in extra]


def _failed(code, out):
    """True when a finished job ended in failure: a non-zero status, or Open MPI's report of a failing abort.

    Open MPI 5.0.11's ``--enable-recovery`` loses the ``MPI_Abort`` code when the rank that aborts is
    the last one alive, and exits 0; its report ("MPI_ABORT was invoked ... Errorcode: 1") remains.
    """
    return code not in (None, 0) or ("MPI_ABORT was invoked on rank" in out
                                     and re.search(r"Errorcode: [1-9]", out) is not None)


#: Seconds the launcher of a job with a dead rank may outlive the last of the job's other processes
#: before it is stopped: Open MPI 5.0.11's ``prterun --enable-recovery`` sometimes never exits after
#: every rank has ended (one killed, the others through ``MPI_Abort``; 1 launch in 14 of
#: ``experiments.faults.dead`` at P = 3 on the loaded 2-core machine).
LAUNCHER_ALONE_S = 3.0


def _launch(P, module, args, env, limit, extra=(), progress=None, more=()):
    """Run ``mpiexec -n P python -m module args``; return (exit status or None when killed, seconds, output).

    ``more``: further programs of an MPMD launch, ``(n, args)`` each (``... : -n n python -m module args``,
    ranks numbered in that order).

    The job is killed when ``limit`` seconds pass; with ``progress`` (a callable returning a count
    of finished work, polled every 0.5 s) only when that count has not changed for ``limit``
    seconds, so a hang in one case costs ``limit`` and not the whole batch's allowance. Killed means
    SIGKILL to the launcher and every process of the job (:func:`commlab.job_control.stop_job`: both
    launchers put the ranks in process groups of their own); ranks still running when their launcher
    has ended (Open MPI's ``--enable-recovery`` may leave survivors of an abort for seconds) are
    killed too. ``extra``: launcher options as MPICH takes them (:func:`_launcher`). With
    ``-disable-auto-cleanup`` (a rank will die), a launcher left alone for :data:`LAUNCHER_ALONE_S`
    is stopped: the job ended when its last rank did (the seconds count to then, the status is 0
    and the output says so; :func:`_failed` reads the abort report).
    """
    watch = "-disable-auto-cleanup" in extra
    own, extra = _launcher(extra)
    cmd = [default_mpiexec(), *extra, "-n", str(P), sys.executable, "-m", module, *args]
    for n, more_args in more:
        cmd += [":", "-n", str(n), sys.executable, "-m", module, *more_args]
    full, mark = marked_env({**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                             **own, **env})
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    last, seen, alone, ran = start, None, None, False
    while True:
        try:
            out, _ = proc.communicate(timeout=0.5 if progress is not None or watch else limit)
            secs = time.perf_counter() - start
            if job_processes(value=mark):  # ranks still running after their launcher ended: no leftovers
                stop_job(proc, mark, first=signal.SIGKILL)
            return proc.returncode, secs, out
        except subprocess.TimeoutExpired:
            now = time.perf_counter()
            if progress is not None and progress() != seen:
                seen, last = progress(), now
            if watch:  # the launcher alone, after the job's ranks have started
                others = set(job_processes(value=mark)) - {proc.pid}
                ran = ran or bool(others)
                alone = (alone or now) if ran and not others else None
            if now - last > limit or (alone is not None and now - alone > LAUNCHER_ALONE_S):
                stop_job(proc, mark, first=signal.SIGKILL)
                out, _ = proc.communicate()
                if now - last > limit:
                    return None, now - start, out
                return 0, alone - start, out + f"\n[launcher still running {LAUNCHER_ALONE_S:g} s after the " \
                    "job's last rank ended: stopped]\n"


launch = _launch  # public: other studies launch their crash jobs the same way


def run_matrix(P, mode, timeout, limit, only=None):
    """Run every mismatch case at P ranks in ``mode``; return one result dict per case.

    Parameters
    ----------
    P : int
        Ranks.
    mode : {"default", "detail", "strict", "detail-no-timeout"}
    timeout : float or None
        ``timeout=`` of every call (seconds); ignored for ``detail-no-timeout``.
    limit : float
        Hard limit of one case (seconds) before its job is killed and the case counted as a hang.
    only : list of str, optional
        Case names to run (default all).
    """
    from experiments.faults.collective_cases import case_names

    names = only or case_names()
    env = {"COMMLAB_DEBUG": {"default": "", "detail": "detail", "strict": "strict",
                             "detail-no-timeout": "detail"}[mode]}
    args = [] if mode == "detail-no-timeout" or timeout is None else ["--timeout", str(timeout)]
    results, start = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        while start < len(names):
            code, secs, out = _launch(P, "experiments.faults.collective_cases", ["--out", tmp, "--only", ",".join(names[start:]),
                                                                     *args], env, limit,
                                      progress=lambda: sum(map(len, read_records(tmp, P).values())))
            recs = read_records(tmp, P)
            done = [n for n in names[start:] if len(recs.get(n, {})) == P]
            for n in done:
                results.append(_classify(n, recs[n], P, mode))
            start += len(done)
            if start < len(names):  # the job stopped inside names[start]: a hang (killed) or a crash
                n = names[start]
                hang = "hang" if mode != "detail-no-timeout" or (mode, n.split("/")[0]) not in UNDETECTABLE \
                    else "expected-hang"  # no timeout, and no fingerprint sees an extra call: it waits
                results.append({"case": n, "P": P, "mode": mode, "verdict": hang if code is None else "crash",
                                "detail": out[-400:], "ranks": recs.get(n, {})})
                start += 1
            for f in os.listdir(tmp):
                os.remove(os.path.join(tmp, f))
    return results


def _classify(name, recs, P, mode):
    wrong = [r for r, rec in recs.items() if rec["outcome"] == "wrong"]
    verdict = "pass" if not wrong else ("expected-silent" if (mode, name.split("/")[0]) in UNDETECTABLE
                                        else "silent-wrong")
    errors = sorted({rec.get("error", "") for rec in recs.values() if rec["outcome"] == "error"})
    return {"case": name, "P": P, "mode": mode, "verdict": verdict, "wrong_ranks": wrong,
            "max_seconds": max(rec["seconds"] for rec in recs.values()), "errors": errors}


def run_dead(P, timeout, limit):
    """A rank dies before an all-reduce: the job must end (non-zero) within ``timeout`` + 5 s of the death.

    The ``large`` case: it dies in the middle of a 4 MiB ring all-reduce, and a survivor's receive
    fails inside the MPI library; the line must name it as lost (``PeerLost``), without a traceback.
    """
    results = []
    for alg in ("ring", "mpi", "auto", "ring/large"):
        launched = time.time()
        code, secs, out = _launch(P, "experiments.faults.dead", [alg.split("/")[0], str(timeout), *alg.split("/")[1:]],
                                  {}, limit, extra=("-disable-auto-cleanup",))
        seconds = _crash_seconds(out, launched + secs)
        named = "PeerLost" in out and "Traceback" not in out if alg.endswith("large") else "CollectiveTimeout" in out
        ok = _failed(code, out) and seconds is not None and seconds <= timeout + 5 and named
        results.append({"case": f"dead_rank/{alg}", "P": P, "mode": "default", "seconds": seconds,
                        "verdict": "pass" if ok else ("hang" if code is None else "fail"), "detail": out[-300:]})
    return results


#: Trainer flags of the crash and kill-and-resume trials: a small synthetic model, a few seconds a run.
_TRAIN = ["--data", "synthetic", "--samples", "1200", "--features", "16", "--classes", "4", "--hidden", "32",
          "--batch-size", "48", "--epochs", "2", "--no-progress"]


def _crash_seconds(out, end):
    """Seconds from the injected crash (the time it printed) to ``end``, or None when it never came."""
    found = re.search(r"injected crash at ([0-9.]+)", out)
    return None if found is None else end - float(found.group(1))


def run_crashes(limit):
    """A rank of a training job dies mid-run, under ``mpiexec -disable-auto-cleanup``.

    Cases: the data-parallel trainer (``--timeout 3``) on 2 and 3 ranks, and rank 0 dying while it
    sets the run up (the others wait on its broadcast of the run directory); the parameter server
    (``--ps-timeout 3``, 1 server + 3 workers) with a worker dying under BSP and SSP, and with the
    server dying. A case passes when the job ends with a non-zero status within the timeout + 5 s
    of the crash and the output names the cause in an ``error:`` line, without a traceback.
    """
    cases = [("dp/P=2", 2, ["dp", "1", "5", "--timeout", "3"]),
             ("dp/P=3", 3, ["dp", "2", "5", "--timeout", "3"]),
             ("setup/P=2", 2, ["setup", "0", "1", "--timeout", "3"]),
             ("dp-powersgd/P=2", 2, ["dp", "1", "5", "--timeout", "3", "--compression", "powersgd"]),
             ("dp-topk/P=3", 3, ["dp", "2", "5", "--timeout", "3", "--compression", "topk"]),
             ("ps-worker/bsp", 4, ["ps", "3", "5", "--mode", "ps", "--ps-timeout", "3", "--consistency", "bsp"]),
             ("ps-worker/ssp", 4, ["ps", "3", "5", "--mode", "ps", "--ps-timeout", "3", "--consistency", "ssp"]),
             ("ps-server", 4, ["ps", "0", "20", "--mode", "ps", "--ps-timeout", "3", "--servers", "1"])]
    results = []
    for name, P, args in cases:
        with tempfile.TemporaryDirectory() as tmp:
            launched = time.time()
            code, secs, out = _launch(P, "experiments.faults.crash", [*args, *_TRAIN, "--run-dir", tmp], {}, limit,
                                      extra=("-disable-auto-cleanup",))
            seconds = _crash_seconds(out, launched + secs)
        ok = _failed(code, out) and seconds is not None and seconds <= 3 + 5 and "error:" in out \
            and "Traceback" not in out
        results.append({"case": f"crash/{name}", "P": P, "mode": "default", "verdict": "pass" if ok else
                        ("hang" if code is None else "fail"), "seconds": seconds, "detail": out[-300:]})
    return results


def _final_params(run_dir):
    from training.runtime.checkpoint import find_checkpoint
    from commlab.file_formats import read_npz

    return read_npz(find_checkpoint(run_dir))["model/params"]


#: The small job of :func:`run_kill_resume` with ``small=True`` (the test suite's trials): a second or two.
_SMALL = ("--data", "synthetic", "--samples", "400", "--features", "8", "--classes", "3", "--hidden", "16",
          "--batch-size", "32", "--epochs", "4", "--dtype", "float64", "--checkpoint-every", "1", "--no-progress")


def run_kill_resume(trials, limit, seed=0, small=False):
    """Kill a 2-rank training job at a random moment (SIGKILL to the whole job), restart it as documented, compare.

    The oracle is an uninterrupted run of the same configuration: the restarted run's final parameters
    must be bitwise equal (a resume restores model, optimizer, sampler and counters exactly). A trial
    whose restart fails or ends with other parameters counts as *data lost*. Kills land anywhere: before
    the run directory or its ``config.json`` exists (the same ``--name`` then starts it again, leftovers
    of an interrupted write included), during a checkpoint write, between epochs. Every second trial is
    aimed at a checkpoint write: its delay is a moment the uninterrupted run finished writing a
    checkpoint (the file's time since that launch) less up to 50 ms. ``small``: the seconds-long job
    of the test suite's trials instead of the full part's.
    """
    import numpy

    rng = numpy.random.default_rng(seed)
    flags = list(_SMALL) if small else [*_TRAIN, "--samples", "30000", "--hidden", "64", "--epochs", "8",
                                        "--checkpoint-every", "1"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        launched = time.time()
        code, total, out = _launch(2, "training.train", [*flags, "--run-dir", tmp, "--name", "ref"], {}, limit)
        if code != 0:
            return [{"case": "kill_resume/reference", "P": 2, "mode": "default", "verdict": "fail",
                     "detail": out[-300:]}]
        reference = _final_params(os.path.join(tmp, "ref"))
        saves = [os.path.getmtime(f) - launched for f in glob.glob(os.path.join(tmp, "ref", "ckpt-epoch*.npz"))]
        for t in range(trials):
            delay = float(rng.uniform(0.3, total))
            if t % 2 and saves:  # aimed at a checkpoint write
                delay = max(0.3, float(rng.choice(saves)) - float(rng.uniform(0.0, 0.05)))
            name = f"t{t}"
            _launch(2, "training.train", [*flags, "--run-dir", tmp, "--name", name], {}, delay)  # killed at delay
            run = os.path.join(tmp, name)
            at_kill = len(glob.glob(os.path.join(run, "ckpt-epoch*.npz")))
            if not os.path.exists(os.path.join(run, "config.json")):  # killed before the run wrote its configuration
                code, _, out = _launch(2, "training.train", [*flags, "--run-dir", tmp, "--name", name], {}, limit)
            else:
                code, _, out = _launch(2, "training.train", ["--resume", run, "--no-progress"], {}, limit)
            lost = code != 0 or not numpy.array_equal(_final_params(run), reference)
            results.append({"case": f"kill_resume/{t}", "P": 2, "mode": "default", "kill_after_s": round(delay, 3),
                            "aimed_at_save": bool(t % 2 and saves),
                            "checkpoints_at_kill": at_kill,
                            "verdict": "data-lost" if lost else "pass", "detail": out[-300:] if lost else ""})
    return results


def _totals(results):
    t = {"cases": len(results), "passed": 0, "hangs": 0, "silent_wrong": 0, "expected_silent": 0,
         "expected_hangs": 0, "data_lost": 0, "other": 0}
    for r in results:
        key = {"pass": "passed", "hang": "hangs", "silent-wrong": "silent_wrong", "expected-silent": "expected_silent",
               "expected-hang": "expected_hangs", "data-lost": "data_lost"}.get(r["verdict"], "other")
        t[key] += 1
    return t


def main(argv=None):
    """Run the suite and print its totals; exit 1 when a target is missed."""
    ap = Parser(prog="python -m experiments.faults.suite",
                                 description="Fault-and-mismatch suite of the collectives (launches mpiexec).")
    ap.add_argument("--part", choices=("quick", "full"), default="quick",
                    help="quick: P=3, default and strict modes, damaged checkpoints, a few different options and "
                         "torn records; full: P=3 and 4, every mode, dead ranks, damaged checkpoints, every option "
                         "and torn-record case, training crashes, kill-and-resume trials")
    ap.add_argument("--timeout", type=real(0, 1e15, low_open=True), default=None, help="timeout= of every call in seconds "
                    "(default 2; 0.2 in the quick part's default mode, where about 60 cases end only by "
                    "their timeout)")
    ap.add_argument("--trials", type=integer(1, INT32_MAX), default=8, help="kill-and-resume trials of the full part")
    ap.add_argument("--out", type=outpath(empty=True), default=None, help="write every case's result here (JSON)")
    args = ap.parse_args(argv)
    quick = args.part == "quick"
    timeout = args.timeout or 2.0
    # In default mode most mismatches end by their timeout (one wait each); a raise on a slow rank is a
    # pass, so a short timeout keeps the quick part's verdicts and cuts its wait.
    timeouts = {mode: args.timeout or (0.2 if quick and mode == "default" else timeout)
                for mode in ("default", "detail", "strict", "detail-no-timeout")}
    limit = timeout * 4 + 20
    results = []

    def part(label, found):
        results.extend(found)
        t = _totals(found)
        print(f"{label:34s} {t['cases']:3d} cases, {t['passed']:3d} passed, {t['hangs']} hangs, "
              f"{t['silent_wrong']} silent wrong, {t['data_lost']} data lost", flush=True)

    for P in ((3,) if quick else (3, 4)):
        for mode in (("default", "strict") if quick else ("default", "detail", "strict", "detail-no-timeout")):
            part(f"mismatch matrix P={P} {mode}", run_matrix(P, mode, timeouts[mode], limit))
        if not quick:
            part(f"dead rank P={P}", run_dead(P, timeout, timeout + 30))
    part("damaged checkpoints", run_checkpoint_cases() + run_ps_checkpoint_cases() + run_sharded_checkpoint_cases())
    part("different options, torn records", run_job_part(_launch, quick))
    if not quick:
        part("training crashes", run_crashes(60))
        part("kill and resume", run_kill_resume(args.trials, 120))
    for r in results:
        if r["verdict"] != "pass":
            print(f"{r['verdict']:16s} P={r['P']} {r['mode']:18s} {r['case']:32s} "
                  f"{json.dumps(r.get('wrong_ranks', r.get('detail', '')))[:160]}")
    t = _totals(results)
    print(f"cases {t['cases']} | passed {t['passed']} | hangs {t['hangs']} | silent wrong answers "
          f"{t['silent_wrong']} (+{t['expected_silent']} silent and {t['expected_hangs']} hung without a timeout: "
          f"the extra call no field fingerprint can see, caught by strict) | data lost {t['data_lost']} | "
          f"other failures {t['other']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"totals": t, "timeout": timeouts, "results": results}, f, indent=1)
    return 0 if t["hangs"] == 0 and t["silent_wrong"] == 0 and t["data_lost"] == 0 and t["other"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
