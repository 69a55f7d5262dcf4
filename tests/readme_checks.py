"""The table of every command the README and the docs show, and how :mod:`tests.test_readme` checks it:
:class:`Run` (run as written, in a quick mode), :class:`Help` (flags checked against ``--help``,
outputs taken from committed reference results) or :class:`Covered` (another test runs it)."""
import socket
from dataclasses import dataclass, field

__all__ = ["Run", "Help", "Covered", "CHECKS"]


@dataclass(frozen=True)
class Run:
    """Run the command with ``extra`` arguments appended (after any ``--`` separator's command).

    ``launcher`` (``"mpich"`` or ``"openmpi"``) runs a command written for one launcher's options only
    where the tests' ``mpiexec`` is that launcher's (``make test MPI=openmpi`` runs the Open MPI ones).
    ``records`` are ``(key, value)`` pairs the run's ``runs/latest/summary.json`` must hold; the
    launcher's exit status is then not the verdict (a crash run under MPICH ends non-zero by design).
    """

    extra: tuple = ()
    timeout: float = 120
    launcher: str = ""
    records: tuple = ()


@dataclass(frozen=True)
class Help:
    """Check the command's flags against its module's ``--help``; ``provides`` maps the paths it
    would write (relative to the block's directory) to committed files that stand in for them."""

    covered: str
    provides: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Covered:
    """The command is checked by the test ``covered`` (``path::name``, or ``make test``)."""

    covered: str
    why: str


_QUICK_TRAIN = ("--epochs", "1", "--no-progress")
#: What docs/guide/ps_replication.md says a crash run's summary.json shows: the primary lost, no
#: acknowledged update lost.
_PRIMARY_LOST = (("servers_lost", [0]), ("lost_acknowledged", 0))


def _free_port():
    """Return a TCP port of 127.0.0.1 free now (for a documented ``--metrics-port`` run as written)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


_FREE_PORT = _free_port()

#: README command (as written, comments dropped, one space between words) -> how it is checked.
CHECKS = {
    # The two commands
    "make run": Run(),  # checked through `make -n run`: the recipe, run with --epochs 1
    "make test": Covered("make test", "the test suite itself"),
    "make docs": Covered("tests/test_docs.py::test_docs_build_with_no_warning", "the same sphinx-build -W"),
    "make results": Covered("tests/test_docs.py::test_published_tables_equal_the_committed_result_files",
                            "plots.publish --check renders every item as make results does"),
    # Parameter server: versions, conflicts and retries (docs/ps.md)
    "mpiexec -n 5 python -m training.train --mode ps --consistency asp --ps-conflict cas --ps-conflict-lag 3 "
    "--ps-retries 3": Run(_QUICK_TRAIN),
    "mpiexec -n 5 python -m experiments.studies.ps_study --parts conflict,retries --repeats 3 --out "
    "results/ps_conflict": Help("tests/test_ps_versions.py::test_versions_conflicts_retries_and_bad_requests_on_four_ranks"),
    # Embedding tables (docs/guide/ctr.md)
    "mpiexec -n 4 python -m training.train --model ctr --mode hybrid --servers 2 --optimizer adagrad --lr 0.05 "
    "--lr-schedule constant --batch-size 1024 --epochs 1": Run(("--ctr-rows", "4000", "--ctr-train", "4096",
                                                               "--ctr-test", "2048", "--no-progress")),
    "python -m experiments.cluster.ctr run --out results/cluster/ctr --study results/cluster/ctr_study.json":
        Covered("tests/test_ctr.py::test_study_commands_and_report_at_tiny_sizes", "its commands and report at tiny sizes"),
    "python -m experiments.studies.hot_rows --seeds 3 --out results/ctr_hotkeys.json":
        Help("tests/test_ctr.py::test_hot_key_remedy_balances_the_servers_at_four"),
    "python -m plots.ctr results/cluster/ctr_study.json":
        Covered("tests/test_ctr.py::test_study_commands_and_report_at_tiny_sizes", "drawn from the tiny report"),
    "python -m training.emulator.emulate --nodes 2 --ranks-per-node 3 --link 1gbit --survive-crashes -- python -m "
    "experiments.faults.crash ps 0 60 --mode ps --servers 2 --ps-replicas 2 --ps-timeout 1":
        Covered("tests/test_cluster.py::test_a_replicated_servers_primary_dies_across_emulated_nodes",
                "the same crash across two emulated nodes, with the digits model"),
    # Replicated shards (docs/guide/ps_replication.md)
    "mpiexec -n 5 python -m training.train --mode ps --servers 2 --ps-replicas 2 --ps-timeout 1": Run(_QUICK_TRAIN),
    "mpiexec -disable-auto-cleanup -n 5 python -m experiments.faults.crash ps 0 60 --mode ps --servers 2 "
    "--ps-replicas 2 --ps-timeout 1": Run(_QUICK_TRAIN, launcher="mpich", records=_PRIMARY_LOST),
    "mpiexec --enable-recovery -n 5 python -m experiments.faults.crash ps 0 60 --mode ps --servers 2 "
    "--ps-replicas 2 --ps-timeout 1": Run(_QUICK_TRAIN, launcher="openmpi", records=_PRIMARY_LOST),
    "mpiexec --with-ft ulfm -n 5 python -m experiments.faults.crash ps 0 60 --mode ps --servers 2 --ps-replicas 2 "
    "--ps-timeout 30":
        Covered("tests/test_elastic.py::"
                "test_the_replicated_parameter_server_learns_of_deaths_from_ulfm_and_fails_over_at_once",
                "this command with 2 epochs into the test's directory, under make test-ft"),
    "python -m experiments.studies.replica_study --crashes 20 --repeats 3 --out results/ps_replicas":
        Help("tests/test_ps_replicas.py::test_training_survives_a_primarys_and_a_backups_crash"),
    ".venv-openmpi/bin/python -m experiments.studies.replica_study --crashes 20 --repeats 3 --out "
    "results/ps_replicas_openmpi":
        Help("tests/test_ps_replicas.py::test_training_survives_a_primarys_and_a_backups_crash"),
    # Predicting a job at scale (docs/guide/predict.md)
    "mpiexec -n 1 python -m training.train --data synthetic --hidden 1024,1024 --epochs 2 --threads 1 --trace "
    "prof.trace.json": Covered("tests/test_trace.py::test_trace_file_of_a_data_parallel_run_and_wait_split",
                               "a traced run whose per-layer events that test reads into a profile"),
    "python -m training.predict.profile --trace prof.trace.json --codec fp16 --codec topk:ratio=0.01 --out "
    "profile.json": Covered("tests/test_trace.py::test_trace_file_of_a_data_parallel_run_and_wait_split",
                            "the same command on that test's trace"),
    "python -m training.predict --profile profile.json --topology topo.json --config algorithm=torus "
    "grid=topology bucket_bytes=1048576 overlap=true": Covered(
        "tests/test_predict.py::test_command_line_bad_files_and_a_prediction", "the command on a hand-made profile"),
    "python -m training.predict.scale --out results/predict/scale": Covered(
        "tests/test_predict.py::test_scale_study_on_small_p_and_its_figure", "the study's run() at P = 64 and 256"),
    "python -m plots.predict results/predict/scale.json": Covered(
        "tests/test_predict.py::test_scale_study_on_small_p_and_its_figure", "draw() on that run's answer"),
    "python -m training.predict.validate --out results/predict/validation": Covered(
        "tests/test_predict.py::test_validation_harness_on_a_tiny_plan", "its plan, commands, --dry-run and figures"),
    "python -m training.predict.floor": Run(),
    # Unequal workers: batch shares (docs/guide/heterogeneity.md)
    "mpiexec -n 2 python -m training.train --straggler 1:2 --balance --balance-every 10": Run(_QUICK_TRAIN),
    "mpiexec -n 3 python -m training.train": Run(_QUICK_TRAIN),
    "mpiexec -n 4 python -m training.train --mode ps --balance --memory-gb 1": Run(_QUICK_TRAIN),
    "mpiexec -n 2 python -m experiments.studies.hetero_study --workers 2 --repeats 5":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    "mpiexec -n 3 python -m experiments.studies.hetero_study --workers 2 --repeats 5":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    "python -m plots.hetero results/hetero/hetero_w2_dp.json results/hetero/hetero_w2_ps.json":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    "python -m training.emulator.emulate --nodes 2 --ranks-per-node 1 --link 1gbit -- python -m "
    "experiments.studies.hetero_study --workers 2 --repeats 3 --out results/hetero_cluster":
        Help("tests/test_cluster.py::test_racks_behind_uplinks_give_the_torus_its_third_level"),  # with namespaces
    "python -m training.emulator.emulate --nodes 3 --ranks-per-node 1 --link 1gbit -- python -m "
    "experiments.studies.hetero_study --workers 2 --repeats 3 --out results/hetero_cluster":
        Help("tests/test_cluster.py::test_racks_behind_uplinks_give_the_torus_its_third_level"),  # with namespaces
    "mpiexec -n 4 python -m experiments.studies.hetero_study --workers 4 --methods equal,balance,local4 "
    "--conditions even,slow2,slow4 --repeats 3 --out results/hetero_p4":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    "mpiexec -n 4 python -m experiments.studies.hetero_study --workers 4 --job digits --methods equal,balance,local4 "
    "--conditions even,slow2,slow4 --repeats 3 --out results/hetero_digits":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    "python -m plots.hetero results/hetero_cluster/hetero_w2_dp.json results/hetero_cluster/hetero_w2_ps.json":
        Help("tests/test_batch_shares.py::test_the_heterogeneity_study_runs_in_quick_mode_and_draws"),
    # Skewed data across workers (docs/guide/non_iid.md)
    "mpiexec -n 4 python -m training.train --partition dirichlet:alpha=0.1": Run(_QUICK_TRAIN),
    "mpiexec -n 4 python -m training.train --partition classes:k=3 --resample --shared-fraction 0.05": Run(_QUICK_TRAIN),
    "mpiexec -n 4 python -m training.train --partition classes:k=3 --optimizer sgd --lr 0.05 --local-steps 16 "
    "--post-local-epoch 2": Run(_QUICK_TRAIN),
    "mpiexec -n 5 python -m training.train --mode ps --consistency ssp --partition dirichlet:alpha=1": Run(_QUICK_TRAIN),
    "mpiexec -n 4 python -m experiments.studies.non_iid_study --workers 4 --seeds 3":
        Help("tests/test_non_iid.py::test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws",
             {"results/non_iid/non_iid_w4_dp.json": "non_iid/non_iid_w4_dp.json"}),
    "mpiexec -n 5 python -m experiments.studies.non_iid_study --workers 4 --seeds 3 --methods "
    "asp,ssp2,ssp2+resample,ssp2+shared":
        Help("tests/test_non_iid.py::test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws",
             {"results/non_iid/non_iid_w4_ps.json": "non_iid/non_iid_w4_ps.json"}),
    "python -m plots.non_iid results/non_iid/non_iid_w4_dp.json results/non_iid/non_iid_w4_ps.json": Run(),
    "mpiexec -n 8 python -m experiments.studies.non_iid_study --workers 8 --seeds 3":
        Help("tests/test_non_iid.py::test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws"),
    "mpiexec -n 9 python -m experiments.studies.non_iid_study --workers 8 --seeds 3 --methods "
    "asp,ssp2,ssp2+resample,ssp2+shared":
        Help("tests/test_non_iid.py::test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws"),
    "python -m plots.non_iid results/non_iid/non_iid_w4_dp.json results/non_iid/non_iid_w4_ps.json "
    "results/non_iid/non_iid_w8_dp.json results/non_iid/non_iid_w8_ps.json":
        Help("tests/test_non_iid.py::test_the_study_runs_end_to_end_in_quick_mode_and_its_figure_draws"),
    # Model parallelism
    "mpiexec -n 4 python -m training.train --tensor-parallel 2 --pipeline-parallel 2 --micro-batches 4":
        Help("tests/test_model_parallel.py::test_cli_writes_grid_summary_and_refuses_bad_grids"),
    "mpiexec -n 8 python -m training.train --tensor-parallel 2 --pipeline-parallel 2 --hidden 512,512,512":
        Help("tests/test_model_parallel.py::test_equivalence_on_eight_ranks"),
    "mpiexec -n 4 python -m experiments.studies.model_parallel_study --out results/model_parallel_p4.json":
        Help("tests/test_model_parallel.py::test_study_grids_and_plot",
             {"results/model_parallel_p4.json": "model_parallel/p4.json"}),
    "python -m training.emulator.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m "
    "experiments.studies.model_parallel_study --out results/model_parallel_p4_1gbit.json --bubble-micro-batches ''":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),  # runs only with namespaces
    "python -m plots.model_parallel results/model_parallel_p4.json":
        Help("tests/test_model_parallel.py::test_study_grids_and_plot"),
    # Simulator
    "python -m experiments.studies.scale_sim --out results/scale_sim.json":
        Run(("--max-p", "64", "--sizes", "1KiB,1MiB")),
    "python -m plots.scaling results/scale_sim.json --out results/scaling.png": Run(),
    # PyTorch and JAX
    "mpiexec -n 2 python torch_example.py": Run(timeout=240),
    "mpiexec -n 2 python -m experiments.jax_example --steps 100":
        Covered("tests/test_interop.py::test_jax_example_on_two_ranks",
                "needs JAX (not a dependency); skipped without it"),
    # Writing an algorithm (docs/guide/algorithms.md): the verifier at P <= 16, the sweeps at their smallest sizes
    "python -m collectives.schedules docs.examples.alltoall:alltoall_allreduce": Run(("--max-size", "16")),
    "python -m collectives.schedules docs.examples.bidirectional_ring:bidirectional_ring_allreduce":
        Run(("--max-size", "16")),
    "mpiexec -n 4 python my_algorithm.py": Run(timeout=240),
    "mpiexec -n 3 python -m experiments.bench.collectives --ops allreduce --dtype int64 --algorithms "
    "mpi,docs.examples.alltoall:alltoall_allreduce,docs.examples.bidirectional_ring:bidirectional_ring_allreduce "
    "--max-bytes 64K --iters 20 --out results/algorithms_p3":
        Run(("--max-bytes", "1K", "--iters", "3", "--warmup", "1", "--repeats", "1", "--allow-noisy"), timeout=300),
    "mpiexec -n 4 python -m experiments.bench.collectives --ops allreduce --algorithms "
    "mpi,ring,docs.examples.alltoall:alltoall_allreduce,docs.examples.bidirectional_ring:bidirectional_ring_allreduce "
    "--min-bytes 1M --max-bytes 16M --timeline results/rounds --out results/algorithms_p4":
        Run(("--max-bytes", "1M", "--iters", "3", "--warmup", "1", "--repeats", "1", "--allow-noisy"), timeout=300),
    "mpiexec -n 4 python -m training.train --algorithm docs.examples.bidirectional_ring:bidirectional_ring_allreduce":
        Run(_QUICK_TRAIN, timeout=240),
    "python -m training.emulator.emulate --nodes 2 --ranks-per-node 2 --link 1gbit -- python -m "
    "experiments.bench.collectives --ops allreduce --algorithms ring,docs.examples.alltoall:alltoall_allreduce "
    "--min-bytes 1M --max-bytes 16M --out results/algorithms_2x2":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),  # runs only with namespaces
    "python -m experiments.studies.scale_sim --algorithms docs.examples.bidirectional_ring:bidirectional_ring_allreduce,"
    "docs.examples.alltoall:alltoall_allreduce --max-p 1024 --sizes 1MiB --out results/scale_algorithms.json":
        Run(("--max-p", "64"), timeout=240),
    # Collectives
    "mpiexec -n 4 python example.py": Run(),
    # Shared memory within a node (docs/guide/shm.md): the sweeps at their smallest sizes, one pass
    "mpiexec -n 4 python shm_example.py": Run(timeout=240),
    "mpiexec -n 4 python -m training.train --algorithm shm --name shm": Run(_QUICK_TRAIN, timeout=240),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops allreduce --min-bytes 256K --max-bytes 64M "
    "--algorithms shm,shm-persistent,limit,MPI_Allreduce --out results/bench_shm_p2":
        Run(("--max-bytes", "256K", "--iters", "3", "--warmup", "1", "--repeats", "1", "--allow-noisy"), timeout=240),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops allreduce --max-bytes 4K "
    "--algorithms shm-persistent,MPI_Allreduce --out results/bench_shm_small_p2":
        Run(("--max-bytes", "16", "--iters", "3", "--warmup", "1", "--repeats", "1", "--allow-noisy"), timeout=240),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops reduce_scatter,allgather --min-bytes 1M --max-bytes 64M "
    "--algorithms shm,limit --out results/bench_shm_rsag_p2":
        Run(("--max-bytes", "1M", "--iters", "3", "--warmup", "1", "--repeats", "1", "--allow-noisy"), timeout=240),
    "python -m experiments.bench.shm_targets results/bench_shm_p2.json results/bench_shm_small_p2.json "
    "results/bench_shm_rsag_p2.json": Run(),
    "mpiexec -n 2 python -m experiments.bench.shm_breakdown --sizes 256K,4M,64M "
    "--out results/bench_shm_breakdown_p2.json":
        Run(("--sizes", "64K", "--passes", "1", "--calls", "2", "--allow-noisy"), timeout=240),
    # Parameter server from one's own script (docs/guide/parameter_server.md)
    "mpiexec -n 3 python ps_example.py": Run(),
    # Benchmarks
    "python -m experiments --list": Run(),
    "mpiexec -n 2 python -m experiments demo --mib 1 --iters 5": Run(timeout=180),
    "mpiexec -n 4 python -m experiments.bench.collectives --out results/bench_p4":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks", {"results/bench_p4.json": "bench_p4.json"}),
    "mpiexec -n 2 python -m experiments.bench.collectives --out results/bench_p2":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks", {"results/bench_p2.json": "bench_p2.json"}),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops allreduce --max-bytes 1M --iters 50":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks"),
    "mpiexec -n 2 python -m experiments.bench.collectives --ops allreduce,reduce_scatter,allgather --max-bytes 4096 "
    "--algorithms auto,mpi,MPI_Allreduce,MPI_Iallreduce,MPI_Allreduce_init,persistent,MPI_Reduce_scatter,"
    "MPI_Ireduce_scatter_block,MPI_Allgather,MPI_Iallgather --out results/bench_small_p2":
        Help("tests/test_bench.py::test_sweep_p2_columns_busbw_and_checks"),
    "mpiexec -n 2 python -m experiments.bench.breakdown --out results/bench_breakdown_p2.json":
        Help("tests/test_bench_calls.py::test_breakdown_times_every_step_of_the_repeated_call"),
    "mpiexec -n 2 python -m experiments.bench.breakdown --op reduce_scatter --out results/bench_breakdown_rs_p2.json":
        Help("tests/test_bench_calls.py::test_breakdown_of_a_repeated_reduce_scatter"),
    "python -m plots.bench results/bench_p4.json --markdown --out results":
        Help("tests/test_bench.py::test_tune_and_plot_on_a_real_sweep"),
    "python -m experiments.bench.tune results/bench_p2.json results/bench_p4.json --out results/tuning.json --tolerance 0.15":
        Run(),
    "COMMLAB_TUNING=results/tuning.json mpiexec -n 4 python -m experiments.demo":
        Help("tests/test_bench.py::test_tune_table_round_trips_through_select"),
    # Gradient compression
    "mpiexec -n 4 python -m training.train --compression topk --compression-arg ratio=0.01":
        Help("tests/test_training_mpi.py::test_crashed_rank_ends_a_compressed_run_within_the_timeout"),
    # Emulated cluster (namespaces)
    "python -m training.emulator.emulate --nodes 4 --ranks-per-node 1 --link 1gbit -- python -m training.train":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m training.emulator.emulate --nodes 4 --ranks-per-node 2 --link 100mbit --calibrate "
    "--out results/cluster/calibrate_100mbit.json":
        Help("tests/test_cluster.py::test_link_rate_within_tolerance"),
    "python -m experiments.cluster.node_collectives run --out results/cluster/collectives --study "
    "results/cluster/collectives_study.json":
        Help("tests/test_cluster_studies.py::test_collectives_study_gathers_both_links_and_names_where_2d_wins"),
    "python -m plots.cluster results/cluster/collectives_study.json":
        Covered("tests/test_cluster_studies.py::test_collectives_study_gathers_both_links_and_names_where_2d_wins",
                "draws the gathered record of synthetic sweeps (the sweeps need the emulator's namespaces)"),
    # Compression across emulated nodes
    "python -m experiments.cluster.compression run --epochs 3 --out results/cluster/compression --study "
    "results/cluster/compression_study.json":
        Help("tests/test_cluster_studies.py::test_compression_study_gathers_its_sweeps_into_one_quiet_file_and_publishes_it"),
    "python -m plots.cluster results/cluster/compression_study.json":
        Covered("tests/test_cluster_studies.py::test_compression_study_gathers_its_sweeps_into_one_quiet_file_and_publishes_it",
                "draws the gathered record of synthetic sweeps (the sweeps need the emulator's namespaces)"),
    # Parameter server against all-reduce across emulated nodes
    "python -m experiments.cluster.ps run --epochs 3 --repeats 2 --hidden 512 --hidden 1024,1024 --out "
    "results/cluster/ps --study results/cluster/ps_study.json":
        Help("tests/test_cluster_studies.py::test_ps_study_gathers_both_models_with_their_wire_time"),
    "python -m plots.cluster results/cluster/ps_study.json":
        Covered("tests/test_cluster_studies.py::test_ps_study_gathers_both_models_with_their_wire_time",
                "draws the gathered record of synthetic runs (the runs need the emulator's namespaces)"),
    # Calibrating the simulator (emulated cluster)
    "python -m training.emulator.emulate --nodes 2 --ranks-per-node 2 --link 1gbit -- python -m "
    "experiments.bench.collectives --ops allreduce --algorithms ring,rabenseifner,2d,tree,recursive_doubling "
    "--min-bytes 64K --max-bytes 64M --iters 5 --warmup 1 --max-time 3 --repeats 2 --out results/cluster/fit_2x2":
        Help("tests/test_cluster.py::test_nodes_found_as_configured"),
    "python -m experiments.cluster.model --intra results/cluster/fit_1x4.json --fit 2=results/cluster/fit_2x2.json "
    "--fit 1=results/cluster/fit_4x1.json --predict 2=results/cluster/collectives/collectives_1gbit.json "
    "--predict 2=results/cluster/fit_4x2_rd.json --out results/cluster/model":
        Help("tests/test_cluster.py::test_model_replay_equals_the_simulator_without_sharing"),
    "python -m plots.cluster results/cluster/model.json":
        Covered("tests/test_cluster.py::test_model_replay_equals_the_simulator_without_sharing",
                "draws the emulated cluster's results (namespaces)"),
    # Inference
    "mpiexec -n 4 python -m training.train --name served":
        Help("tests/test_inference.py::test_a_tensor_parallel_training_run_is_served_resharded"),
    "mpiexec -n 4 python -m inference.serve --checkpoint runs/served --replicas 3 --balance least-outstanding "
    "--requests 2000 --rate 1000 --run-dir results/serve":
        Help("tests/test_inference.py::test_replicated_serving_answers_equal_the_single_process_prediction"),
    "mpiexec -n 5 python -m inference.serve --checkpoint runs/served --replicas 2 --tensor-parallel 2 ...":
        Help("tests/test_inference.py::test_tensor_parallel_replica_answers"),
    "mpiexec -n 3 python -m inference.serve --checkpoint runs/served --replicas 2 --http 8000":
        Help("tests/test_inference_http.py::test_open_inference_protocol_answers_refuses_bad_bodies_survives_a_burst_and_drains"),
    "mpiexec -n 2 python -m inference.serve --checkpoint runs/served --replicas 1 --service-ms 20 --max-batch 8 "
    "--rate 600 --requests 1200 --run-dir results/serve-600":
        Help("tests/test_inference.py::test_batches_fill_while_the_replica_is_busy_and_throughput_follows_the_offered_load"),
    "mpiexec -n 2 python -m inference.serve --checkpoint runs/served --replicas 1 --service-ms 20 --max-batch 8 "
    "--rate 1200 --requests 2400 --slo-ms 60 --run-dir results/serve-slo":
        Help("tests/test_inference.py::test_a_latency_objective_refuses_early_with_its_reason"),
    "mpiexec -disable-auto-cleanup -n 4 python -m experiments.faults.crash serve 2 25 --checkpoint runs/served "
    "--replicas 3 --balance round-robin --requests 1000 --rate 1500 --replica-timeout 1 --run-dir results/serve-kill":
        Covered("tests/test_inference.py::"
                "test_a_replica_killed_under_a_launcher_that_keeps_the_job_loses_no_request_and_answers_none_twice",
                "this command with the test's checkpoint (under Open MPI, make test-ft: --enable-recovery)"),
    # Live monitoring (docs/guide/monitoring.md)
    "mpiexec -n 4 python -m training.train --metrics-port 9100 --tensorboard runs/tb":
        Run(_QUICK_TRAIN + ("--metrics-port", _FREE_PORT)),  # 9100 may be taken where the tests run
    "mpiexec -n 4 python -m training.train --mode ps --consistency asp --metrics-port 9100 --metrics-interval 0.5":
        Run(_QUICK_TRAIN + ("--metrics-port", _FREE_PORT)),  # 3 workers share the global batch 22/21/21
    "mpiexec -n 4 python -m experiments.bench.metrics_overhead --repeats 5":
        Help("tests/test_monitor.py::test_monitoring_on_three_ranks"),
    # Parameter server
    "mpiexec -n 5 python -m training.train --mode ps --servers 1 --consistency ssp --staleness 2 --straggler 2:4":
        Help("tests/test_ps_train.py::test_bsp_matches_data_parallel_training"),
    # Elastic training (docs/guide/elastic.md): Open MPI's ULFM, run by make test-ft
    "make test-ft": Covered("tests/test_elastic.py::test_every_survivor_of_a_killed_rank_raises_process_failed_naming_it_in_every_form",
                            "make test-ft runs tests/test_elastic.py, this test among them"),
    ".venv-openmpi/bin/mpiexec --with-ft ulfm -n 4 .venv-openmpi/bin/python -m training.train --elastic --elastic-min 2":
        Covered("tests/test_elastic.py::test_the_trainer_keeps_training_on_the_survivors_and_says_who_died_when",
                "the trainer with --elastic under mpiexec --with-ft ulfm, a rank killed (make test-ft)"),
    ".venv-openmpi/bin/mpiexec --with-ft ulfm -n 4 .venv-openmpi/bin/python -m training.train --elastic "
    "--elastic-respawn": Covered("tests/test_elastic.py::test_a_run_that_loses_a_rank_ends_as_the_survivors_resumed_from_that_step",
                                 "its respawn cases: the same options, a rank killed (make test-ft)"),
    ".venv-openmpi/bin/python -m experiments.studies.elastic_recovery --kills 20 --ranks 4 --respawn --out results/elastic.json":
        Help("tests/test_elastic.py::test_the_recovery_study_runs_one_kill_every_way",
             {"results/elastic.json": "elastic/elastic_p4.json"}),
    ".venv-openmpi/bin/python -m experiments.studies.elastic_recovery --kills 20 --ranks 8 --out results/elastic_p8.json":
        Help("tests/test_elastic.py::test_the_recovery_study_runs_one_kill_every_way",
             {"results/elastic_p8.json": "elastic/elastic_p8.json"}),
    ".venv-openmpi/bin/python -m experiments.studies.elastic_recovery --kills 20 --cluster 2x2 --link 1gbit --respawn "
    "--out results/elastic_cluster.json":
        Help("tests/test_elastic.py::test_the_recovery_study_runs_one_kill_every_way",
             {"results/elastic_cluster.json": "elastic/elastic_cluster.json"}),
    ".venv-openmpi/bin/python -m training.emulator.emulate --nodes 2 --ranks-per-node 2 --link 1gbit --ulfm "
    "--spare-slots 2 -- .venv-openmpi/bin/python -m training.train --elastic --elastic-respawn":
        Covered("tests/test_elastic.py::test_on_the_emulated_cluster_a_lost_node_is_replaced_and_the_run_ends_as_on_one_machine",
                "the same emulator options and trainer flags, node 1's ranks killed (make test-ft)"),
    "python -m plots.recovery results/elastic.json": Run(()),
}
