"""``python -m mpidist <command>``: ``info [--json]`` describes the MPI installation and the job."""

from __future__ import annotations

import sys

_USAGE = "usage: python -m mpidist info [--json]\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE + "  info    versions, MPI library, thread level, CUDA awareness, "
                         "launcher, ranks per host (rank 0 prints; --json for JSON)\n")
        return 0 if argv else 2
    if argv[0] != "info":
        sys.stderr.write(f"python -m mpidist: unknown command {argv[0]!r}\n{_USAGE}")
        return 2
    from .start.info import main as info_main

    return info_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
