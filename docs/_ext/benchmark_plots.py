"""Draw the performance page's plots from the numbers it tabulates (a Sphinx extension).

The numbers are the measurements of the issue closing notes (2 cores, the mpich 5.0.2 wheel,
``MPI_THREAD_MULTIPLE``, 2 ranks, a quiet machine); the page's tables show the same numbers.
The PNGs go to ``docs/_generated/`` (not kept in git) when the build starts.
"""

from __future__ import annotations

from pathlib import Path

#: mpidist / raw mpi4py time, all_reduce at 2 ranks (benchmarks/allreduce.py)
ALLREDUCE_RATIO = {"8 B": 1.54, "64 B": 1.31, "4 KiB": 1.17, "32 KiB": 1.03, "1 MiB": 1.01, "4 MiB": 0.98,
                   "16 MiB": 1.02}
#: mpidist / raw mpi4py time per call at 8 B, 64 KiB, 1 MiB (benchmarks/run.py --quick, 2 ranks)
CALL_RATIO = {
    "all_reduce": (1.46, 1.08, 1.03), "broadcast": (1.73, 1.17, 1.09), "reduce": (2.05, 1.07, 1.03),
    "all_gather (list)": (3.29, 1.41, 1.12), "all_gather_into_tensor": (1.93, 1.13, 1.03),
    "reduce_scatter_tensor": (1.83, 1.10, 1.16), "all_to_all_single": (2.41, 1.42, 1.07),
    "gather": (3.70, 1.54, 1.10), "scatter": (3.67, 1.45, 1.01), "send/recv": (1.94, 1.24, 1.03),
}
#: DDP step in ms, mpidist vs gloo, same run (benchmarks/torch_backend.py)
DDP_MS = {"6.9k params, 2 ranks": (0.56, 1.26), "6.9k params, 4 ranks": (1.84, 16.3),
          "10.3 M params, 2 ranks": (70.8, 116.8), "10.3 M params, 4 ranks": (178.0, 262.0)}


def _save(plt, fig, path: Path) -> None:  # noqa: ANN001 - matplotlib's own objects
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(list(ALLREDUCE_RATIO), list(ALLREDUCE_RATIO.values()), marker="o")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("mpidist / raw mpi4py time")
    ax.set_title("all_reduce, 2 ranks: the cost of mpidist over the same MPI call")
    _save(plt, fig, out / "allreduce_ratio.png")

    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(CALL_RATIO)
    width = 0.27
    for k, label in enumerate(("8 B", "64 KiB", "1 MiB")):
        ax.bar([i + (k - 1) * width for i in range(len(names))], [CALL_RATIO[n][k] for n in names], width,
               label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("mpidist / raw mpi4py time")
    ax.set_title("Every call at 2 ranks")
    _save(plt, fig, out / "call_ratio.png")

    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    labels = list(DDP_MS)
    ax.barh([i + 0.2 for i in range(len(labels))], [DDP_MS[k][0] for k in labels], 0.4, label="mpidist")
    ax.barh([i - 0.2 for i in range(len(labels))], [DDP_MS[k][1] for k in labels], 0.4, label="gloo")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("ms per DDP step (log scale)")
    ax.set_title("DDP step, torch backend vs gloo, same run")
    _save(plt, fig, out / "ddp_step.png")


def setup(app):  # noqa: ANN001, ANN201 - Sphinx's extension entry point
    app.connect("builder-inited", lambda app: draw(Path(app.srcdir) / "_generated"))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
