# commlab: `make run` trains on 4 ranks and draws the plots; `make test` runs the test suite.
# Both create .venv with python3 and install everything, including MPICH from PyPI.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP     ?= 4

.PHONY: run test demo clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[mpich,test,data]'
	touch $@

run: $(VENV)/.installed
	$(MPIEXEC) -n $(NP) $(PY) -m training.train
	$(PY) -m plots.training runs/latest

demo: $(VENV)/.installed
	$(MPIEXEC) -n $(NP) $(PY) -m experiments.demo

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) runs results *.egg-info .pytest_cache
