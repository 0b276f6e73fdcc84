"""Message sizes as the benchmarks' options give them: ``8``, ``64K``, ``64KiB``, ``1M``, ``16MiB``."""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``"8"``, ``"64K"``, ``"64KiB"``, ``"1M"``, ``"16MiB"`` → bytes (an argparse ``type=``)."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 8, 64K, 1M, 16MiB)")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes → bytes."""
    return [parse_size(s) for s in text.split(",") if s.strip()]
