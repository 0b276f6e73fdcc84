"""accelerate's own ``test_distributed_data_loop.py`` on CPUs: its ``main()``, less the join tests.

Started as the script itself would be (``torchrun``, or ``mpiexec ... python -m mpidist.run``), from
``integrations/test_accelerate_scripts_jobs.py``. The script is imported from the installed
package, unmodified, and its ``main()`` runs in its own order. The functions named in
:data:`GPU_ONLY` are replaced, each by a line ``SKIPPED <name>: <why>`` on rank 0; so are the
stateful-DataLoader tests where torchdata is missing (:data:`NEED_TORCHDATA`). Rank 0's last
line, ``RAN ...``, names every other ``test_*`` function of ``main()`` that did run, in order.

The join tests check ``Accelerator.join_uneven_inputs``, which acts only where
``Accelerator.multi_device`` holds (``MULTI_GPU``, ``MULTI_XPU``, ...; never ``MULTI_CPU``): on
CPUs it warns "Joining uneven inputs is only supported for multi-GPU training" and does nothing,
so ranks with uneven batches make different numbers of DDP steps and wait for each other for
ever (under torchrun on gloo as on mpidist), and the ``even_batches`` override that the others
check is never made.
"""

from __future__ import annotations

import ast
import functools
import inspect

from accelerate import PartialState
from accelerate.test_utils.scripts import test_distributed_data_loop as script
from accelerate.utils import is_torchdata_stateful_dataloader_available

WHY = ("join_uneven_inputs() acts on multi-GPU (and other accelerator) runs only; on CPUs it warns and "
       "does nothing")
#: accelerate's join tests, GPU-only by design, and what a CPU run lacks for each
GPU_ONLY = {
    "test_can_join_uneven_inputs": WHY + ": uneven DDP steps without Join never end",
    "test_join_can_override_even_batches": WHY + ": even_batches is not overridden",
    "test_join_can_override_for_mixed_type_dataloaders": WHY + ": even_batches is not overridden",
    "test_join_raises_warning_for_iterable_when_overriding_even_batches":
        WHY + ": the map-style warning is never given",
}
#: accelerate's StatefulDataLoader comes from torchdata (>= 0.8)
NEED_TORCHDATA = {
    "test_stateful_dataloader": "StatefulDataLoader needs torchdata>=0.8, which is not installed",
    "test_stateful_dataloader_save_state": "StatefulDataLoader needs torchdata>=0.8, which is not installed",
}


def called_by_main() -> list[str]:
    """The names of the script's ``test_*`` functions that its ``main()`` calls."""
    tree = ast.parse(inspect.getsource(script.main))
    return [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id.startswith("test_")]


def main() -> None:
    calls = set(called_by_main())
    skip = dict(GPU_ONLY)
    if not is_torchdata_stateful_dataloader_available():
        skip.update(NEED_TORCHDATA)
    gone = sorted(set(skip) - calls)
    assert not gone, f"accelerate's main() no longer calls {gone}: update this driver"
    ran: list[str] = []

    def skipped(name: str):
        def skip_it(*args, **kwargs) -> None:
            if PartialState().is_main_process:
                print(f"SKIPPED {name}: {skip[name]}", flush=True)
        return skip_it

    def recorded(name: str, fn):
        @functools.wraps(fn)
        def run_it(*args, **kwargs):
            out = fn(*args, **kwargs)
            ran.append(name)
            return out
        return run_it

    for name in sorted(calls):
        setattr(script, name, skipped(name) if name in skip else recorded(name, getattr(script, name)))
    script.main()
    if PartialState().is_main_process:
        print(f"RAN {' '.join(ran)}", flush=True)


if __name__ == "__main__":
    main()
