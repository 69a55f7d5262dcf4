"""Batch shares: any global batch over any number of ranks, and ``--balance`` (``training.dp.shares``).

* The split rule (``ps.shards.key_ranges.proportional``): sums to the batch, every share in [1, cap], largest
  remainders, equal speeds give 64 over 3 = 22/21/21; refuses a batch that would leave a rank 0
  samples or does not fit the bound.
* The data order: the epoch's global batches are the same for every P, hold every sample once per
  epoch (plus at most P - 1 of padding), and equal shares deal each rank exactly the samples of the
  round-robin sampler.
* The decision: a 2x slower rank gets half the speed's share; noise below the gain moves nothing; a
  rank whose speed changes is followed at the next gather (within K steps); no share ever exceeds
  the memory bound; checkpoint state round-trips and another job's shares are not taken.
* Multi-rank (``tests/mpi_shares.py``): at P = 3 and 5, parameters after every step equal one process's
  on the same global batches (buckets, overlap) and every default (data-parallel and --mode ps BSP)
  updates as one process; at P = 3, --balance with a straggler (and with compression, error feedback
  and a bitwise resume), no re-split without one (bitwise).
* Bad input: one clear line each (--balance on the model-parallel grid, K < 1, a global batch
  smaller than P, a memory bound leaving no sample or too few for the batch).
"""
import os
import re

import numpy as np
import pytest

from ps.shards.key_ranges import proportional
from tests.mpirun import run_mpi
from training.dp.shares import BatchShares, share_cap
from training.data.sampling import DistributedSampler, deal


def test_the_split_rule_sums_bounds_and_rounds_by_largest_remainder():
    assert proportional(np.ones(3), 64).tolist() == [22, 21, 21]
    assert proportional(np.ones(5), 64).tolist() == [13, 13, 13, 13, 12]
    assert proportional(np.array([2.0, 1.0]), 512).tolist() == [341, 171]  # 341.33 / 170.67: 171 has the larger rest
    assert proportional(np.array([1.0, 1.0, 1000.0]), 3).tolist() == [1, 1, 1]  # at least one each
    rng = np.random.default_rng(0)
    for _ in range(3000):
        W = int(rng.integers(1, 8))
        rate = rng.random(W) * rng.choice([1.0, 100.0], W) + 1e-9
        total = int(rng.integers(W, 300))
        cap = int(rng.integers(-(-total // W), total + 1)) if rng.random() < 0.5 else None
        s = proportional(rate, total, cap)
        assert s.sum() == total and s.min() >= 1 and (cap is None or s.max() <= cap), (rate, total, cap, s)
        quota = rate * total / rate.sum()
        if cap is None and quota.min() >= 1:  # nothing raised to 1 nor cut to a bound: floor or ceiling of the quota
            assert (np.abs(s - quota) < 1).all(), (quota, s)
    with pytest.raises(ValueError, match="cannot give each of 3 workers at least one"):
        proportional(np.ones(3), 2)
    with pytest.raises(ValueError, match="does not fit 2 workers of at most 4"):
        proportional(np.ones(2), 9, cap=4)


@pytest.mark.parametrize("P", [1, 2, 3, 5, 7])
def test_global_batches_are_one_permutation_for_every_p(P):
    for n, B in [(600, 61), (1438, 64), (10, 4), (23, 10), (12, 12)]:
        if B < P:
            continue
        one = list(DistributedSampler(n, 0, 1, seed=4).global_batches(2, B))
        mine = list(DistributedSampler(n, 0, P, seed=4).global_batches(2, B))
        assert all(len(b) >= P for b in mine)
        flat = np.concatenate(mine)
        assert np.array_equal(np.unique(flat), np.arange(n)) and len(flat) - n < P  # each once (+ padding < P)
        if n % B >= P or n % B == 0:  # no padding needed: the very batches of one process
            assert all(np.array_equal(a, b) for a, b in zip(one, mine)) and len(one) == len(mine)
        for batch in mine:  # any shares deal each sample of the batch to exactly one rank
            shares = proportional(np.arange(1, P + 1, dtype=float), len(batch))
            parts = deal(batch, shares)
            assert [len(p) for p in parts] == shares.tolist()
            assert np.array_equal(np.sort(np.concatenate(parts)), np.sort(batch))


@pytest.mark.parametrize("P, B", [(2, 64), (4, 64), (3, 60)])
def test_equal_shares_deal_the_round_robin_samplers_batches(P, B):
    samplers = [DistributedSampler(600, r, P, seed=1) for r in range(P)]  # P divides 600 and B: no padding
    old = [list(s.batches(0, B // P)) for s in samplers]
    for k, batch in enumerate(samplers[0].global_batches(0, B)):
        parts = deal(batch, [len(batch) // P] * P)
        assert all(np.array_equal(parts[r], old[r][k]) for r in range(P))


def test_the_decision_follows_speed_ignores_noise_and_keeps_the_bound():
    s = BatchShares(2, 512, balance=True)
    assert s.decide(np.array([1e-3, 2e-3])).tolist() == [341, 171]  # one rank 2x slower: 2/3 and 1/3
    assert s.last["ideal_s"] == pytest.approx(512 / 1500.0)
    s.shares = s.decide(np.array([1e-3, 2e-3]))
    assert s.decide(np.array([1.01e-3, 1.98e-3])).tolist() == [341, 171]  # 1 % noise: kept
    assert s.decide(np.array([2e-3, 1e-3])).tolist() == [171, 341]  # the slowdown moved: followed
    capped = BatchShares(3, 90, balance=True, cap=40)
    for per in np.random.default_rng(1).random((200, 3)) * np.array([1.0, 10.0, 100.0]) + 1e-6:
        got = capped.decide(per)
        assert got.sum() == 90 and got.max() <= 40 and got.min() >= 1
    assert capped.decide(np.array([1e-3, 1e-2, 1e-2])).tolist() == [40, 25, 25]  # the fast rank at its bound
    assert not BatchShares(2, 8).due(10) and BatchShares(2, 8, balance=True, every=5).due(10)


class _Gather:
    """A communicator stand-in for BatchShares.update at P = 1 of a P-rank job: the speeds already gathered."""

    def __init__(self, per):
        self.per = per

    def Get_rank(self):
        return 0


def test_a_speed_change_is_followed_within_k_steps(monkeypatch):
    import training.dp.shares as shares_mod

    K, B = 4, 120
    seen = {}
    monkeypatch.setattr(shares_mod.collectives, "allreduce",
                        lambda buf, **kw: buf.__setitem__(slice(None), seen["per"]))
    s = BatchShares(2, B, every=K, balance=True)
    history = []
    for step in range(1, 25):
        slow = 1 if step <= 10 else 0  # rank 1 slow for steps 1-10, then rank 0
        seen["per"] = np.array([1e-3, 1e-3]); seen["per"][slow] = 3e-3
        s.observe(1.0, 1)
        if s.due(step):
            s.update(_Gather(seen["per"]))
        history.append(s.shares.tolist())
    assert history[3] == [90, 30]  # first gather at step 4: rank 1 at a third of rank 0's speed
    first = next(i + 1 for i, h in enumerate(history) if h == [30, 90])
    assert 10 < first <= 10 + K, history  # the move after step 10 is followed within K steps
    assert s.moves == 2


def test_noise_does_not_move_the_shares_back_and_forth_but_speed_changes_move_them_within_k_steps(monkeypatch):
    """Rank 0 of 2 measures its own steps with +-12 % noise; rank 1 takes 2 ms a sample (its figure
    given). Rank 0 takes 1.3 ms a sample for steps 1-40, 1 ms for steps 41-70 (1.3x faster), 3 ms
    from step 71 (3x slower). Oracle: the split in proportion to the true speeds (72 / 48, 80 / 40,
    48 / 72 of 120), which the shares leave by at most 4 samples and move away from at most 3 times
    in the steps of each speed after its first gather at K = 2; and each change, at a gather, is
    followed at the next one, within K steps. A speed-up counts as a slowdown does: 1.3 ms to 1 ms is
    1.3x faster, though only 23 % fewer seconds per sample."""
    import training.dp.shares as shares_mod
    from training.dp.shares import window_estimate

    for step_s in (1.3, 1 / 1.3):  # 20 steps at 1 s a sample, then 2 at the new speed: a restart either way
        assert window_estimate([1.0] * 20 + [step_s] * 2, 2) == (step_s, [step_s] * 2)

    rng = np.random.default_rng(0)
    monkeypatch.setattr(shares_mod.collectives, "allreduce", lambda buf, **kw: buf.__setitem__(1, 2e-3))
    s, K = BatchShares(2, 120, every=2, balance=True, gain=0.05), 2
    history = []
    for step in range(1, 101):
        t0 = 1e-3 * (1.3 if step <= 40 else 1.0 if step <= 70 else 3.0)
        s.observe(t0 * (1 + rng.uniform(-0.12, 0.12)) * s.shares[0], int(s.shares[0]))
        if s.due(step):
            s.update(_Gather(None))
        history.append(int(s.shares[0]))
    for first, last, want in ((2, 40, 72), (40 + K, 70, 80), (70 + K, 100, 48)):
        span = history[first - 1:last]
        assert max(abs(h - want) for h in span) <= 4, (want, span)  # followed within K steps of each change
        assert sum(a != b for a, b in zip(span, span[1:])) <= 3, (want, span)


def test_shares_state_round_trips_and_another_jobs_are_not_taken():
    s = BatchShares(3, 64, balance=True)
    s.shares, s.moves = np.array([40, 12, 12]), 3
    t = BatchShares(3, 64)
    assert t.load_state_dict(s.state_dict()) and t.shares.tolist() == [40, 12, 12] and t.moves == 3
    assert not BatchShares(4, 64).load_state_dict(s.state_dict())  # another P: the equal split
    assert not BatchShares(3, 64, cap=30).load_state_dict(s.state_dict())  # above this run's bound
    assert BatchShares(3, 64).load_state_dict({}) is False
    with pytest.raises(ValueError, match="balance/shares"):
        BatchShares(3, 64).load_state_dict({"balance/shares": np.array([64, 0, 0])})


def test_bad_shares_arguments_are_refused():
    with pytest.raises(ValueError, match="global batch \\(2\\) is smaller than the number of ranks \\(3\\)"):
        BatchShares(3, 2)
    with pytest.raises(ValueError, match="balance_every must be an integer >= 1"):
        BatchShares(2, 8, every=0)
    with pytest.raises(ValueError, match="does not fit 2 workers of at most 3"):
        BatchShares(2, 8, cap=3)
    with pytest.raises(ValueError, match="must be >= 0 and sum to the batch"):
        deal(np.arange(5), [3, 1])
    with pytest.raises(ValueError, match="leaves it no sample"):
        share_cap(0.001, 2 ** 30, 100)
    with pytest.raises(ValueError, match="smaller than the number of ranks"):
        DistributedSampler(10, 0, 3).epoch_order(0, 2)


@pytest.mark.parametrize("flags, message", [
    (["--balance", "--tensor-parallel", "2"], "balance shares the global batch among data-parallel ranks"),
    (["--balance", "--pipeline-parallel", "2"], "not the model-parallel grid"),
    (["--balance-every", "0"], "balance_every must be >= 1"),
    (["--balance-gain", "1"], "balance_gain must be in [0, 1)"),
    (["--memory-gb", "-1"], "memory_gb must be >= 0"),
    (["--balance", "--local-steps", "4"], "local SGD (--local-steps > 1) has none"),
    (["--balance", "--partition", "classes:k=2"], "it needs --partition iid"),
    (["--balance-every", "5"], "--balance-every tune --balance, which is off: add --balance or drop it"),
    (["--balance-gain", "0.2", "--balance-every", "3"], "--balance-every and --balance-gain tune --balance"),
])
def test_bad_balance_flags_are_one_line(tmp_path, capsys, flags, message):
    from training.train import main

    with pytest.raises(SystemExit) as e:
        main(["--hidden", "8", "--epochs", "1", "--no-progress", "--run-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    line = [t for t in err.splitlines() if "error:" in t]
    assert e.value.code == 2 and len(line) == 1 and message in line[0] and not any(tmp_path.iterdir()), err


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "2"], "the global batch (2) is smaller than the number of ranks (3)"),
    (["--batch-size", "1", "--mode", "ps"], "the global batch (1) is smaller than the number of workers (2"),
])
def test_job_errors_are_one_line_from_rank_0(tmp_path, flags, message):
    res = run_mpi(3, "training.train", "--hidden", "8", "--epochs", "1", "--no-progress", "--run-dir",
                  str(tmp_path), *flags, timeout=90, check=False)
    assert res.returncode == 1 and message in res.stdout and res.stdout.count("error:") == 1, res.stdout
    assert "Traceback" not in res.stdout and not any(tmp_path.iterdir()), res.stdout


@pytest.mark.parametrize("flags, message", [
    (["--memory-gb", "0.0001"], "leaves it no sample"),  # 0.1 MiB: less than the digits alone
    (["--memory-gb", "0.0006", "--batch-size", "4096"], "does not fit 1 workers of at most"),  # ~350 samples
])
def test_a_memory_bound_that_cannot_hold_the_batch_is_one_line(tmp_path, capsys, flags, message):
    from training.train import main

    status = main(["--hidden", "8", "--epochs", "1", "--no-progress", "--run-dir", str(tmp_path), *flags])
    out = capsys.readouterr()
    line = [t for t in (out.out + out.err).splitlines() if "error:" in t]
    assert status == 1 and len(line) == 1 and message in line[0] and "--memory-gb" in line[0], out
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("P, cases", [(3, ("every_step", "balance", "resume_compressed", "no_straggler", "defaults",
                                           "ps")),
                                      (5, ("every_step", "defaults", "ps"))])
def test_any_batch_over_any_p_updates_as_one_process(tmp_path, P, cases):
    out = run_mpi(P, "tests.mpi_shares", str(tmp_path), *cases, timeout=300).stdout
    for case in cases:
        assert f"case_{case}: ok" in out, out


def test_the_batch_size_help_states_the_rule_the_run_applies():
    """Any global batch of at least P samples runs (docs/guide/heterogeneity.md); ``--help`` says so
    and asks for no divisibility."""
    from training.settings.cli import HELP

    text = " ".join(HELP["batch_size"].split())
    assert "must divide" not in text and "at least P" in text, text


def test_the_heterogeneity_study_runs_in_quick_mode_and_draws(tmp_path):
    """Both launches of the study (data-parallel, then the parameter server) on the quick job, and its
    table and figure, then the main job's (``--job digits``); oracle: every (method, condition) has a row, the shares split the batch, the
    ideal step is B over the summed speeds of the equal run, the speedups come from the equal runs."""
    import json

    from experiments.studies.hetero_study import ideal_step
    from plots.hetero import draw, markdown

    out = str(tmp_path / "het")
    common = ("--workers", "2", "--quick", "--conditions", "even,slow4", "--allow-noisy", "--out", out)
    run_mpi(2, "experiments.studies.hetero_study", *common, timeout=240)
    run_mpi(3, "experiments.studies.hetero_study", *common, timeout=240)
    dp = json.loads((tmp_path / "het" / "hetero_w2_dp.json").read_text())
    ps = json.loads((tmp_path / "het" / "hetero_w2_ps.json").read_text())
    assert dp["provenance"]["command"] and {(r["method"], r["condition"]) for r in dp["table"]} == {
        (m, c) for m in ("equal", "balance", "local4") for c in ("even", "slow4")}
    assert {(r["method"], r["condition"]) for r in ps["table"]} == {(m, c) for m in ("ssp2", "ps-balance")
                                                                    for c in ("even", "slow4")}
    bal = next(r for r in dp["runs"] if (r["method"], r["condition"]) == ("balance", "slow4"))
    assert sum(bal["shares"]) == 60 and min(bal["shares"]) >= 1, bal["shares"]  # the quick job's split is load noise
    t = next(r for r in dp["runs"] if (r["method"], r["condition"]) == ("equal", "even"))["seconds_per_sample"]
    row = next(r for r in dp["table"] if (r["method"], r["condition"]) == ("equal", "slow4"))
    assert row["ideal_s"] == pytest.approx(60 / (1 / t + 1 / (4 * t)))
    assert row["speedup"] == 1.0 and all(r["ideal_s"] for r in ps["table"])  # the dp file's equal runs
    assert "| ps-balance" in markdown([dp, ps]) and (tmp_path / "h.png").exists() is False
    assert os.path.getsize(draw([dp, ps], str(tmp_path / "h.png"))) > 1000
    run_mpi(2, "experiments.studies.hetero_study", "--workers", "2", "--job", "digits", "--quick", "--methods",
            "equal,balance", "--conditions", "slow2", "--allow-noisy", "--out", str(tmp_path / "digits"), timeout=240)
    dig = json.loads((tmp_path / "digits" / "hetero_w2_dp_digits.json").read_text())  # the main job's model and data
    assert (dig["train_config"]["data"], dig["train_config"]["batch_size"], dig["train_config"]["epochs"]) == (
        "digits", 64, 1) and [r["method"] for r in dig["table"]] == ["equal", "balance"], dig["train_config"]
    copied = tmp_path / "het" / "hetero_w2_dp.json"  # a parameter-server launch never borrows another job's runs
    copied.write_text((tmp_path / "digits" / "hetero_w2_dp_digits.json").read_text())
    res = run_mpi(3, "experiments.studies.hetero_study", *common, check=False, timeout=120)
    assert res.returncode == 2 and "was measured on another job (data 'digits'" in res.stdout + res.stderr, res


def test_the_live_monitor_shows_each_ranks_share(tmp_path):
    """--monitor --tensorboard with --balance and a 4x straggler on a model whose step is mostly compute:
    TensorBoard's batch_share scalars (read back with TensorBoard's own reader) hold each rank's
    samples per step, which sum to the global batch at every gather and end smaller for the straggler;
    the epoch records and the summary carry the same shares."""
    import json

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    run_mpi(2, "training.train", "--hidden", "512,512", "--epochs", "1", "--no-progress", "--threads", "1",
            "--straggler", "1:4", "--balance", "--balance-every", "2", "--tensorboard", str(board),
            "--metrics-every", "4", "--run-dir", str(tmp_path), "--name", "m", timeout=180)
    acc = EventAccumulator(str(board))
    acc.Reload()
    share = {r: [p.value for p in acc.Scalars(f"batch_share/rank{r}")] for r in (0, 1)}
    pairs = list(zip(share[0], share[1]))[:-1]  # the last gather holds the epoch's short batch (1438 = 22 x 64 + 30)
    assert len(pairs) >= 3 and all(a + b == pytest.approx(64, abs=1e-3) for a, b in pairs), share
    assert share[1][-2] < share[0][-2], share
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    epochs = [json.loads(t) for t in (tmp_path / "m" / "epochs.jsonl").read_text().splitlines()]
    assert summary["shares"] == epochs[-1]["shares"] and summary["shares"][1] < summary["shares"][0], summary


@pytest.mark.parametrize("spec, text", [("1:2@5", "first entry's step must be 0"),
                                        ("1:2,0:2", "needs @STEP"), ("1:2,0:2@x", "needs @STEP"),
                                        ("1:2,0:2@0", "must be above 0"), ("1:0.5", "finite number >= 1"),
                                        ("1:2,0:inf@4", "finite number >= 1"), ("1", "RANK:FACTOR")])
def test_a_bad_straggler_schedule_is_one_line_naming_the_entry(spec, text):
    from training.monitor.setup import straggler_schedule
    with pytest.raises(ValueError, match=re.escape(text)):
        straggler_schedule(spec)


def test_balance_follows_a_slowdown_that_moves_to_another_rank(tmp_path):
    """--straggler 1:4,0:4@23: rank 1 4x slower through epoch 1 (23 steps), rank 0 from epoch 2 on;
    with --balance every 2 steps the straggler holds the smaller share at the end of each epoch (the
    epoch records), and the shares sum to the global batch."""
    import json

    run_mpi(2, "training.train", "--hidden", "512,512", "--epochs", "2", "--no-progress", "--threads", "1",
            "--straggler", "1:4,0:4@23", "--balance", "--balance-every", "2", "--run-dir", str(tmp_path),
            "--name", "m", timeout=180)
    epochs = [json.loads(t) for t in (tmp_path / "m" / "epochs.jsonl").read_text().splitlines()]
    first, second = epochs[0]["shares"], epochs[1]["shares"]
    assert sum(first) == sum(second) == 64, epochs
    assert first[1] < first[0] and second[0] < second[1], (first, second)
