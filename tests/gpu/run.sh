#!/usr/bin/env bash
# Real GPU tests: CuPy and torch CUDA buffers through every collective, with MPI's
# CUDA-awareness forced off (host staging) and on (device pointers straight to MPI; only
# meaningful on a CUDA-aware MPI -- skipped otherwise). One short run, bounded by timeouts.
#   usage: tests/gpu/run.sh [python]     (default: .venv/bin/python, else python3)
set -u
cd "$(dirname "$0")/../.."
PY=${1:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
MPIEXEC=$(dirname "$PY")/mpiexec
[ -x "$MPIEXEC" ] || MPIEXEC=mpiexec
"$PY" - <<'PYEOF' || { echo "run.sh: no usable GPU (need torch with CUDA or cupy)"; exit 2; }
import importlib.util, sys
ok = False
if importlib.util.find_spec("torch"):
    import torch
    ok = torch.cuda.is_available()
if not ok and importlib.util.find_spec("cupy"):
    import cupy
    ok = cupy.cuda.runtime.getDeviceCount() > 0
print("gpu available:", ok)
sys.exit(0 if ok else 1)
PYEOF
"$PY" -c "import mpidist.gpu as g; print('cuda_aware:', g.cuda_aware()); print(g.describe())"
status=0
for aware in 0 1; do
  for n in 1 2; do
    echo "== MPIDIST_CUDA_AWARE=$aware, $n ranks"
    MPIDIST_CUDA_AWARE=$aware timeout 300 "$MPIEXEC" -n $n "$PY" -m pytest --only-mpi \
      tests/gpu/test_gpu.py -q -p no:cacheprovider -x || status=1
  done
done
exit $status
