"""Cost of the live monitoring on the trainer's step time: the same training with and without it.

``mpiexec -n P python -m experiments.bench.metrics_overhead [--repeats 5] [--epochs 3] [--metrics-every 10]``

Each repeat trains the same data-parallel run three times on the ranks: without monitoring (``off``),
with ``--monitor`` (``watch``: the gathers, heartbeats and straggler and stall detection, nothing
served) and with ``--metrics-port`` (``serve``: the same plus the Prometheus endpoint of rank 0,
scraped every ``--scrape-every`` seconds (0.5) by a process of its own, :mod:`experiments.bench.scrape`,
as a Prometheus server would be). The order rotates between repeats, so a drift in the machine's
load hits every variant alike. A run's step time is the median of its steps' durations on rank 0
(consecutive ``wall_s`` of ``metrics.jsonl``). Printed: the median step time of each variant, the
ratio to ``off`` per repeat with its median and range (the target: within the spread of the ``off``
runs themselves, and the monitoring's own time <= 2 % of the step), and the internal figures of the
runs' summaries: ``monitor_overhead`` (the monitoring code's own time over the step time, largest
rank), each rank's (``monitor_overhead_ranks``), and ``export_overhead`` (rank 0's time setting the
exporter's metrics, a part of rank 0's own time). Results go to
``results/bench_metrics_overhead.json`` with the configuration, the scrapes each served run got,
and the ``provenance`` (:mod:`commlab.provenance`: on a busy machine the benchmark refuses to start
unless ``--allow-noisy`` marks its file noisy).
"""
import os
import socket
import statistics
import subprocess
import sys

from experiments import harness
from training.settings.config import Config
from commlab.file_formats import read_jsonl
from commlab.run_files import run_info
from training.train import run
from training.settings.options import INT32_MAX, integer, real

__all__ = ["STUDY", "main", "VARIANTS"]

#: The variants, in the order of the first repeat.
VARIANTS = ("off", "watch", "serve")


def _options(p):
    p.add_argument("--epochs", type=integer(1, INT32_MAX), default=3, help="epochs per run (default: %(default)s)")
    p.add_argument("--metrics-every", type=integer(1, INT32_MAX), default=10, help="steps between gathers (default: %(default)s)")
    p.add_argument("--scrape-every", type=real(0, 1e15, low_open=True), default=0.5,
                   help="seconds between the scrapes of a served run (default: %(default)s)")


def _step_times(path):
    """Return the step durations (seconds) of a run from its ``metrics.jsonl`` (an epoch's first step left out)."""
    rows = read_jsonl(path)
    return [b["wall_s"] - a["wall_s"] for a, b in zip(rows, rows[1:]) if a["epoch"] == b["epoch"]]


#: The repository root: the scraper's working directory, where ``python -m experiments...`` finds the package.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _start_scraper(port, every):
    """Start :mod:`experiments.bench.scrape` on ``port`` in a process of its own (rank 0 only)."""
    return subprocess.Popen([sys.executable, "-m", "experiments.bench.scrape", "--port", str(port),
                             "--every", str(every)], cwd=_ROOT, stdout=subprocess.PIPE, text=True)


def _stop_scraper(proc):
    """Stop the scraper; return how many pages it read."""
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    words = out.split()
    return int(words[1]) if len(words) >= 2 and words[0] == "scrapes" else 0


def _free_port(comm):
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    return comm.bcast(port, root=0)


def _one(base, mode, name, comm, every):
    """Train one run of variant ``mode``; return rank 0's (median step seconds, summary, pages scraped)."""
    port = _free_port(comm) if mode == "serve" else 0
    cfg = base.replace(name=name, monitor=mode == "watch", metrics_port=port)
    scraper = _start_scraper(port, every) if port and comm.Get_rank() == 0 else None
    try:
        summary = run(cfg, comm)
    finally:
        scraped = _stop_scraper(scraper) if scraper is not None else 0
    if comm.Get_rank() != 0:
        return None, None, 0
    return statistics.median(_step_times(os.path.join(base.run_dir, name, "metrics.jsonl"))), summary, scraped


#: The internal figures kept from each monitored run's summary (training.monitor.sync.SyncMonitor.close).
INTERNAL = ("monitor_overhead", "monitor_overhead_ranks", "export_overhead")


def _runs(base, repeats, comm, every):
    """Train the three variants per repeat, order rotating; return {variant: [step seconds]}, the internal
    figures ({variant: {figure: [per repeat]}}) and the pages each served run's scraper read."""
    times = {m: [] for m in VARIANTS}
    internal = {m: {k: [] for k in INTERNAL} for m in VARIANTS[1:]}
    scraped = []
    run(base.replace(name="warmup", epochs=1), comm)
    for i in range(repeats):
        order = VARIANTS[i % 3:] + VARIANTS[:i % 3]
        for mode in order:
            step, summary, pages = _one(base, mode, f"{mode}{i}", comm, every)
            if comm.Get_rank() == 0:
                times[mode].append(step)
                if mode != "off":
                    for k in INTERNAL:
                        internal[mode][k].append(summary.get(k))
                if mode == "serve":
                    scraped.append(pages)
    return times, internal, scraped


def _run(args, comm):
    """Train the rounds; rank 0 prints the ratios and returns the record."""
    with harness.scratch_folder(comm, "bench_metrics-") as tmp:
        base = Config(epochs=args.epochs, run_dir=tmp, progress=False, checkpoint_every=0, keep_checkpoints=1,
                      lr_schedule="constant", metrics_every=args.metrics_every)
        times, internal, scraped = harness.logged(lambda: _runs(base, args.repeats, comm, args.scrape_every),
                                                  os.devnull)  # the runs' tables
    if comm.Get_rank() != 0:
        return None
    off = times["off"]
    spread = (max(off) - min(off)) / statistics.median(off)
    print(f"P={comm.Get_size()}, {base.data}, hidden {list(base.hidden)}, {base.dtype}, batch {base.batch_size}, "
          f"{args.epochs} epochs per run, gather every {args.metrics_every} steps, {args.repeats} repeats")
    result = {"config": {**base.to_dict(), "repeats": args.repeats, "scrape_every": args.scrape_every},
              "run": run_info(comm), "step_s": times, "off_spread": spread, "scrapes": scraped}
    print(f"off: median step {statistics.median(off) * 1e3:.3f} ms, range {min(off) * 1e3:.3f}-{max(off) * 1e3:.3f} ms "
          f"(spread {spread:.1%} of the median)")
    for mode in VARIANTS[1:]:
        ratios = [t / o for t, o in zip(times[mode], off)]
        figures = internal[mode]
        med, own = statistics.median(ratios), statistics.median(figures["monitor_overhead"])
        rank0 = statistics.median(r[0] for r in figures["monitor_overhead_ranks"])
        export = statistics.median(figures["export_overhead"])
        within = min(off) <= statistics.median(times[mode]) <= max(off)
        print(f"{mode}: median step {statistics.median(times[mode]) * 1e3:.3f} ms; ratio to off per repeat: median "
              f"{med:.3f}, range {min(ratios):.3f}-{max(ratios):.3f} ({'within' if within else 'outside'} the off "
              f"runs' spread); monitoring's own time {own:.2%} of the step (target <= 2 %), rank 0's {rank0:.2%}, "
              f"of which the exporter's updates {export:.2%}")
        result[mode] = {"ratios": ratios, "ratio_median": med, "ratio_min": min(ratios), "ratio_max": max(ratios),
                        "within_off_spread": within, **figures}
    if scraped:
        print(f"served runs scraped every {args.scrape_every:g} s from another process: {min(scraped)}-{max(scraped)} "
              f"pages per run")
    return result


#: The benchmark as a unit of the harness; ``main(argv)`` returns 0, or 2 after one error line on a bad
#: argument, an unwritable ``--out`` or a busy machine, before any measurement.
STUDY = harness.Study("experiments.bench.metrics_overhead", "Step time with live monitoring against without, "
                      "same run, repeated.", _options, _run, out="results/bench_metrics_overhead.json", repeats=5)
main = STUDY.main


if __name__ == "__main__":
    sys.exit(main())
