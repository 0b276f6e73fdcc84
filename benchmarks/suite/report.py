"""Results out: the stdout table, the goal check, the JSON file and the PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cases import OBJECT_CALLS

KIB, MIB = 1024, 1024 * 1024
RATIOS = (("mpidist/mpi4py", "mpidist", "mpi4py"), ("mpidist/c", "mpidist", "c"),
          ("gloo/mpidist", "gloo", "mpidist"), ("mpidist_torch/mpidist", "mpidist_torch", "mpidist"))


def human_size(n: int) -> str:
    for unit, scale in (("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def human_time(s: float | None) -> str:
    if s is None:
        return "-"
    us = s * 1e6
    if us < 1000:
        return f"{us:.3g} us" if us >= 1 else f"{us:.2f} us"
    return f"{us / 1000:.3g} ms"


def table(results: list[dict], ratios: list[dict], impls: list[str]) -> str:
    """One line per (call, size): the median time of each implementation and the ratios."""
    times = {(r["call"], r["bytes"], r["impl"]): r["median"] for r in results}
    keys = [k for k in RATIOS if k[1] in impls and k[2] in impls]
    head = f"{'call':<24}{'size':>9}" + "".join(f"{i:>13}" for i in impls)
    head += "".join(f"{k[0]:>{max(10, len(k[0]) + 2)}}" for k in keys)
    lines = [head, "-" * len(head)]
    for row in ratios:
        c, b = row["call"], row["bytes"]
        line = f"{c:<24}{human_size(b) if c != 'barrier' else '-':>9}"
        line += "".join(f"{human_time(times.get((c, b, i))):>13}" for i in impls)
        for k in keys:
            v = row.get(k[0])
            line += f"{'-' if v is None else f'{v:.2f}':>{max(10, len(k[0]) + 2)}}"
        lines.append(line)
    return "\n".join(lines)


def goals(ratios: list[dict]) -> list[dict]:
    """issue 8's targets, each with the rows that miss it (``[]`` when met or not measured)."""
    small = [r for r in ratios if r["bytes"] <= 8]
    checks = [
        ("mpidist/mpi4py <= 1.10 at 8 B", "mpidist/mpi4py", small, lambda v: v <= 1.10),
        ("mpidist/mpi4py <= 1.02 at >= 1 MiB", "mpidist/mpi4py",
         [r for r in ratios if r["bytes"] >= MIB], lambda v: v <= 1.02),
        ("mpidist/C <= 5 at 8 B", "mpidist/c", small, lambda v: v <= 5),
        ("gloo/mpidist >= 10 at <= 64 KiB (arrays)", "gloo/mpidist",
         [r for r in ratios if r["bytes"] <= 64 * KIB and r["call"] not in OBJECT_CALLS],
         lambda v: v >= 10),
        ("gloo/mpidist >= 1.5 at >= 1 MiB (arrays)", "gloo/mpidist",
         [r for r in ratios if r["bytes"] >= MIB and r["call"] not in OBJECT_CALLS],
         lambda v: v >= 1.5),
        ("objects faster than gloo's *_object at every size", "gloo/mpidist",
         [r for r in ratios if r["call"] in OBJECT_CALLS], lambda v: v > 1),
    ]
    out = []
    for name, key, rows, ok in checks:
        measured = [r for r in rows if r.get(key) is not None]
        missed = [{"call": r["call"], "bytes": r["bytes"], key: round(r[key], 3)}
                  for r in measured if not ok(r[key])]
        out.append({"goal": name, "measured": len(measured), "missed": missed})
    return out


def goal_text(gs: list[dict]) -> str:
    lines = []
    for g in gs:
        if not g["measured"]:
            state = "not measured"
        elif not g["missed"]:
            state = f"met ({g['measured']} rows)"
        else:
            worst = ", ".join(
                f"{m['call']}@{human_size(m['bytes'])}={list(m.values())[-1]}" for m in g["missed"][:6]
            )
            more = f" (+{len(g['missed']) - 6} more)" if len(g["missed"]) > 6 else ""
            state = f"MISSED in {len(g['missed'])}/{g['measured']}: {worst}{more}"
        lines.append(f"  {g['goal']}: {state}")
    return "\n".join(lines)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def plot(path: Path, results: list[dict], ratios: list[dict], impls: list[str], title: str) -> Path | None:
    """Time vs size per implementation, one panel per call, and mpidist/mpi4py ratios."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    calls = [c for c in dict.fromkeys(r["call"] for r in results) if c != "barrier"]
    cols = 4
    rows = (len(calls) + 1 + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, call in zip(axes.flat, calls):
        for k, impl in enumerate(impls):
            pts = sorted((r["bytes"], r["median"] * 1e6) for r in results
                         if r["call"] == call and r["impl"] == impl)
            if pts:  # one colour per implementation in every panel
                ax.loglog(*zip(*pts), marker="o", ms=3, label=impl, color=f"C{k}")
        ax.set_title(call, fontsize=9)
        ax.set_xlabel("bytes per rank", fontsize=8)
        ax.set_ylabel("µs", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    ax = axes.flat[len(calls)]
    for call in calls + ["barrier"]:
        pts = sorted((r["bytes"] or 1, r["mpidist/mpi4py"]) for r in ratios
                     if r["call"] == call and r.get("mpidist/mpi4py") is not None)
        if pts:
            ax.semilogx(*zip(*pts), marker=".", lw=0.8, label=call)
    ax.axhline(1.10, color="red", lw=0.8, ls="--")
    ax.axhline(1.02, color="orange", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_title("mpidist / raw mpi4py (paired)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=5, ncol=2)
    for extra in list(axes.flat)[len(calls) + 1:]:
        extra.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
