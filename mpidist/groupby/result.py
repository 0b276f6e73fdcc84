"""The value ``aggregate`` returns: key columns and one column per (value, aggregation)."""

from __future__ import annotations

from typing import Any, Iterable, Union

import numpy as np

Name = Union[str, tuple]


class GroupByResult:
    """A group-by result as plain numpy columns, one row per group.

    ``keys`` maps each key name to its column; ``columns`` maps ``(value name, agg)``
    to its column, in the order the aggregations were asked for. ``result[name]``
    returns either kind of column. ``to_dict()`` gives one flat dict of columns and
    ``to_pandas()`` the DataFrame pandas' ``groupby(...).agg(...)`` would build.

    Example::

        r = aggregate(store, amount, ("sum", "mean"))
        r.keys["key"], r.columns[("value", "sum")], r["key"], len(r)
    """

    __slots__ = ("keys", "columns")

    def __init__(self, keys: dict[str, np.ndarray], columns: dict[tuple[str, str], np.ndarray]) -> None:
        self.keys = keys
        self.columns = columns

    def __len__(self) -> int:
        first = next(iter(self.keys.values()), None)
        return 0 if first is None else len(first)

    def __getitem__(self, name: Name) -> np.ndarray:
        if isinstance(name, tuple):
            return self.columns[name]
        return self.keys[name]

    def __repr__(self) -> str:
        cols = [*self.keys, *(f"{v}.{a}" for v, a in self.columns)]
        return f"<GroupByResult {len(self)} groups, columns {cols}>"

    def to_dict(self) -> dict[Name, np.ndarray]:
        """Key columns by name, then aggregated columns by ``(value, agg)``."""
        return {**self.keys, **self.columns}

    def take(self, rows: Any) -> GroupByResult:
        """The rows ``rows`` (an index array, slice or boolean mask) of every column."""
        return GroupByResult({k: c[rows] for k, c in self.keys.items()},
                             {k: c[rows] for k, c in self.columns.items()})

    def sort(self, by: Name | Iterable[Name] | None = None, ascending: bool = True) -> GroupByResult:
        """Rows sorted by column(s) ``by`` (default: the keys), first name most significant.

        Sorting is stable ascending (NaN last); ``ascending=False`` reverses it.
        """
        if by is None:
            names: list[Name] = list(self.keys)
        elif isinstance(by, (str, tuple)):
            names = [by]
        else:
            names = list(by)
        order = np.lexsort([self[n] for n in reversed(names)]) if len(self) else np.arange(0)
        return self.take(order if ascending else order[::-1])

    def head(self, n: int) -> GroupByResult:
        """The first ``n`` rows."""
        return self.take(slice(0, max(0, n)))

    @staticmethod
    def concat(parts: list[GroupByResult]) -> GroupByResult:
        """Rows of ``parts`` one after another (same columns in each)."""
        first = parts[0]
        return GroupByResult({k: np.concatenate([p.keys[k] for p in parts]) for k in first.keys},
                             {k: np.concatenate([p.columns[k] for p in parts]) for k in first.columns})

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` indexed by the keys, columns a MultiIndex (value, agg)."""
        import pandas as pd

        names = list(self.keys)
        if len(names) == 1:
            index = pd.Index(self.keys[names[0]], name=names[0])
        else:
            index = pd.MultiIndex.from_arrays(list(self.keys.values()), names=names)
        columns = pd.MultiIndex.from_tuples(list(self.columns)) if self.columns else None
        return pd.DataFrame({k: v for k, v in self.columns.items()}, index=index, columns=columns)
