"""The trainer-level cases of the fault suite, many to a launch: ranks started with different options
(:mod:`experiments.faults.option_cases`) and run directories with torn records (:mod:`experiments.faults.records`).

``mpiexec -n A python -m experiments.faults.jobs OUT a NAMES : -n B python -m experiments.faults.jobs
OUT b NAMES`` (an MPMD launch: rank 0's program is role ``a``, the others role ``b``) runs the cases
NAMES (comma-separated, ``options/NAME`` or ``records/KIND``) one after the other, each a call of the
trainer's own :func:`training.train.main` on every rank, with what it prints kept (and still shown).
Every rank appends one JSON line per case to ``OUT/rank-R.jsonl``; ranks meet at a barrier between
cases. A case that ends the job (an abort, a crash) leaves the rest to the next launch.
:func:`run_jobs` launches them and gives each case its verdict.
"""
import contextlib
import io
import json
import os
import sys
import tempfile

__all__ = ["run_jobs", "run_job_part", "main", "read_records"]


class _Tee(io.TextIOBase):
    """A text stream that keeps what is written and passes it on to ``stream``."""

    def __init__(self, stream):
        super().__init__()
        self.stream, self.parts = stream, []

    def write(self, text):
        self.parts.append(text)
        self.stream.write(text)
        return len(text)

    def flush(self):
        self.stream.flush()


def _job(argv):
    """Run the trainer's ``main(argv)`` on this rank; return (exit status, what it printed)."""
    from training.train import main as train

    out, err = _Tee(sys.stdout), _Tee(sys.stderr)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = train(argv)
        except SystemExit as exc:  # as the interpreter ends on it: a message is printed, status 1
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr, flush=True)
    return status, "".join(out.parts + err.parts)


def main(argv=None):
    """Rank side: run the cases named on the command line (``OUT ROLE NAMES``)."""
    from mpi4py import MPI

    from experiments.faults import option_cases, records

    out, role, names = (sys.argv[1:] if argv is None else argv)[:3]
    comm, runs, prepared = MPI.COMM_WORLD, os.path.join(out, "runs"), {}
    for name in names.split(","):
        comm.Barrier()
        family, _, which = name.partition("/")
        if family == "options":
            rec = option_cases.run_case(which, role, comm.Get_size(), os.path.join(runs, f"options-{which}"), _job)
        else:
            rec = records.run_case(which, runs, comm, _job, prepared)
        rec.update(case=name, rank=comm.Get_rank())
        with open(os.path.join(out, f"rank-{comm.Get_rank()}.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
    comm.Barrier()


def read_records(out, P):
    """Return {case: {rank: record}} of the records the ranks wrote whole (``out/rank-R.jsonl``)."""
    recs = {}
    for r in range(P):
        path = os.path.join(out, f"rank-{r}.jsonl")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    with contextlib.suppress(ValueError):  # the line a killed rank was writing
                        rec = json.loads(line)
                        recs.setdefault(rec["case"], {})[rec["rank"]] = rec
    return recs


def _classify(name, recs, P):
    from experiments.faults import option_cases, records

    family, _, which = name.partition("/")
    if family == "records":
        return records.verdict(which, recs)
    text = "".join(recs[r]["output"] for r in sorted(recs))
    return option_cases.verdict(which, P, [recs[r]["status"] for r in sorted(recs)], text,
                           any(rec["made"] for rec in recs.values()))


def run_jobs(launch, names, split, limit):
    """Run the cases ``names`` in MPMD launches of ``split`` = (ranks of role a, ranks of role b).

    ``launch``: :func:`experiments.faults.suite.launch`. A launch is killed when no case has
    finished for ``limit`` seconds; the case it stopped in is a hang (killed) or a crash, and the
    cases after it run in a new launch. Returns one result dict per case.
    """
    P, results, start, k = sum(split), [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        while start < len(names):
            out, rest = os.path.join(tmp, f"launch{k}"), ",".join(names[start:])
            os.makedirs(out)
            more = [(split[1], [out, "b", rest])] if split[1] else []
            code, _, text = launch(split[0], "experiments.faults.jobs", [out, "a", rest], {}, limit,
                                   progress=lambda: sum(map(len, read_records(out, P).values())), more=more)
            recs, k = read_records(out, P), k + 1
            for n in names[start:]:
                if len(recs.get(n, {})) < P:
                    break
                verdict, detail = _classify(n, recs[n], P)
                results.append({"case": n, "P": P, "mode": "default", "verdict": verdict, "detail": detail})
                start += 1
            if start < len(names):
                results.append({"case": names[start], "P": P, "mode": "default",
                                "verdict": "hang" if code is None else "crash", "detail": text[-400:]})
                start += 1
    return results


def run_job_part(launch, quick, limit=60):
    """The suite's part of these cases: quick, the quick options and records in one launch of 2 ranks;
    full, every case at 2 and 3 ranks (the records also at 1), and every option as a launch of
    ``python -m training.train`` itself (:func:`experiments.faults.option_cases.run_launches`)."""
    from experiments.faults import option_cases, records

    names = [f"options/{n}" for n in (option_cases.QUICK if quick else option_cases.OPTIONS)]
    kinds = [f"records/{k}" for k in (records.QUICK if quick else records.RECORD_KINDS)]
    if quick:
        return run_jobs(launch, names + kinds, (1, 1), limit)
    return (run_jobs(launch, names + kinds, (1, 1), limit) + run_jobs(launch, names + kinds, (1, 2), limit)
            + run_jobs(launch, kinds, (1, 0), limit) + option_cases.run_launches(launch, list(option_cases.OPTIONS), limit))


if __name__ == "__main__":
    main()
