"""The call registry: each public call's facts, declared once where the call is defined.

A call is declared with :func:`define`, a decorator on its function::

    @define(fingerprint=tensor_and_op, gpu_direct=True, reducing=True)
    def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False): ...

The facts (:class:`Call`) are what the cross-cutting concerns read: debug mode's
fingerprint, whether device buffers may go to a CUDA-aware MPI as they are, whether the
call reduces (16-bit payloads are then summed on the host), which argument names the group,
and whether the call bounds its own wait. None of them looks a call up by its name string.

:func:`define` returns a function with the same signature that runs the call directly, or,
while a hook is set (debug mode), hands the call and its arguments to the hook. The facts
travel with the call: functions pass their :class:`Call` where they used to pass the name,
and it prints as the name in every error message.
"""

from __future__ import annotations

import inspect
import threading
import warnings
from types import CodeType, FrameType
from typing import Any, Callable

#: Facts about a call's arguments that debug mode compares across ranks:
#: ``fingerprint(pg, args) -> ({field: text}, counts or None)``.
Fingerprint = Callable[[Any, dict], tuple]


class Call:
    """One public call and its facts.

    ``name`` is torch's name; ``fingerprint`` describes what must agree across ranks (``None``:
    the call is not a collective and debug mode does not check it); ``gpu_direct``: device
    buffers may go to a CUDA-aware MPI as they are; ``reducing``: 16-bit payloads are reduced
    by mpidist on the host; ``group_arg``: the parameter that names the group; ``bounded``:
    the call bounds its own wait (the stall watch leaves it alone); ``signature``: the names of
    the values the call records for the default cross-rank check (:mod:`mpidist.checks.signature`).
    """

    __slots__ = ("name", "fingerprint", "gpu_direct", "reducing", "group_arg", "bounded", "signature",
                 "function")

    def __init__(self, name: str, fingerprint: Fingerprint | None = None, gpu_direct: bool = False,
                 reducing: bool = False, group_arg: str = "group", bounded: bool = False,
                 signature: tuple[str, ...] = ()) -> None:
        self.name = name
        self.fingerprint = fingerprint
        self.signature = signature
        self.gpu_direct = gpu_direct
        self.reducing = reducing
        self.group_arg = group_arg
        self.bounded = bounded
        self.function: Callable[..., Any] | None = None

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        return format(self.name, spec)

    def __repr__(self) -> str:
        return f"<mpidist call {self.name}>"


#: Every declared call, by name (for tools and tests; the library passes :class:`Call` objects).
REGISTRY: dict[str, Call] = {}
#: The code objects of declared calls' bodies, for the watchers that sample stacks.
_CODES: dict[CodeType, Call] = {}


Hook = Callable[[Call, Callable[..., Any], dict], Any]
#: The globals of every generated entry: each reads the hook as its global ``_hook``, the
#: cheapest lookup there is on the path every call takes.
_SCOPES: list[dict[str, Any]] = []
#: The hooks in force, by owner ("debug", "flight"), outermost first.
_LAYERS: dict[str, Hook] = {}


def hook() -> Hook | None:
    """The hook every declared call runs through (debug mode, the flight recorder), or ``None``."""
    return _SCOPES[0]["_hook"] if _SCOPES else _compose()


def _compose() -> Hook | None:
    layers = list(_LAYERS.values())
    if not layers:
        return None
    if len(layers) == 1:
        return layers[0]

    def run(call: Call, body: Callable[..., Any], args: dict) -> Any:
        def inner(i: int, a: dict) -> Any:
            if i == len(layers):
                return body(**a)
            return layers[i](call, lambda **kw: inner(i + 1, kw), a)
        return inner(0, args)
    return run


def set_hook(owner: str, run: Hook | None) -> None:
    """Route every declared call through ``run(call, body, arguments)`` (``None`` removes it).

    Each ``owner`` (debug mode, the flight recorder) has one hook; several are stacked.
    """
    if run is None:
        _LAYERS.pop(owner, None)
    else:
        _LAYERS[owner] = run
    composed = _compose()
    for scope in _SCOPES:
        scope["_hook"] = composed


def absent(call: Call) -> Any:
    """What a call returns on a group this rank is not a member of, after torch's warning:
    ``-1`` for ``recv`` and ``recv_object_list`` (torch's "not part of the group"), ``None`` for
    every other call."""
    from .errors import WORLD_RANK

    warnings.warn(f"Running {call.name} on global rank {WORLD_RANK} which does not belong to the "
                  "given group.", stacklevel=3)
    return -1 if call.name in ("recv", "recv_object_list") else None


def _entry(body: Callable[..., Any], call: Call) -> Callable[..., Any]:
    """A function with ``body``'s exact signature that checks the hook, then runs ``body``; where
    the call names a group, a group this rank is not in makes it return (:func:`absent`), as
    torch's calls do, and the call holds the group's thread lock while it runs
    (:func:`mpidist.core.concurrency.busy`: a second thread that enters a call on it raises). A call
    that is not hooked (point to point, which pays for every frame) makes the member check
    itself: ``if group is NON_GROUP_MEMBER: return absent(call)``.

    Generated rather than written with ``*args, **kwargs``: keyword and positional calls keep
    torch's signature, and the common case pays one plain call.
    """
    sig = inspect.signature(body)
    params, names = [], []
    defaults: dict[str, Any] = {}
    for p in sig.parameters.values():
        if p.default is p.empty:
            params.append(p.name)
        else:
            defaults[f"_d_{p.name}"] = p.default
            params.append(f"{p.name}=_d_{p.name}")
        names.append(p.name)
    from . import concurrency, groups  # MPI is up by the time calls are declared
    from .errors import NotAMemberError

    args = ", ".join(names)
    lines = [f"def {body.__name__}({', '.join(params)}):"]
    guarded = call.group_arg in names
    if guarded:  # one thread at a time on a group; the lock is re-entrant for calls made of calls
        lines += [f"  _g = _groups.world if {call.group_arg} is None else {call.group_arg}",
                  "  _lock = getattr(_g, 'lock', None)",
                  "  if _lock is not None:",
                  "    if not _lock.acquire(False):",
                  "      _busy(_g, _call)",
                  "    _g.holder = (_call, _ident())"]
    if call.group_arg:  # torch's rule for a group this rank is not in: warn and return
        lines.append("  try:")
    lines += ["    if _hook is not None:",
              f"        return _hook(_call, _body, {{{', '.join(f'{n!r}: {n}' for n in names)}}})"]
    lines.append(f"    return _body({args})")
    if call.group_arg:
        lines += ["  except _NotMember:", "    return _absent(_call)"]
    if guarded:
        lines += ["  finally:", "    if _lock is not None:", "      _lock.release()"]
    src = "\n".join(lines) + "\n"
    scope: dict[str, Any] = {"_hook": hook(), "_call": call, "_body": body, "_NotMember": NotAMemberError,
                             "_absent": absent, "_groups": groups.registry, "_busy": concurrency.busy,
                             "_ident": threading.get_ident, **defaults}
    _SCOPES.append(scope)
    exec(compile(src, f"<mpidist.core.registry {body.__name__}>", "exec"), scope)  # noqa: S102
    fn = scope[body.__name__]
    fn.__doc__, fn.__module__, fn.__qualname__ = body.__doc__, body.__module__, body.__qualname__
    fn.__annotations__ = body.__annotations__
    fn.__wrapped__ = body
    fn.call = call
    return fn


def define(name: str | None = None, *, fingerprint: Fingerprint | None = None,
           gpu_direct: bool = False, reducing: bool = False, group_arg: str = "group",
           bounded: bool = False, hooked: bool = True,
           signature: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Any]:
    """Declare the decorated function as a call with these facts (see :class:`Call`).

    With ``hooked`` (the default) the function is wrapped so that debug mode sees it; calls
    that are parts of other calls, or that never communicate as a collective, pass ``False``.
    The function's :class:`Call` is its ``call`` attribute.
    """
    def declare(body: Callable[..., Any]) -> Any:
        call = Call(name or body.__name__, fingerprint, gpu_direct, reducing, group_arg, bounded,
                    signature)
        REGISTRY[call.name] = call
        _CODES[body.__code__] = call
        fn = _entry(body, call) if hooked else body
        call.function = fn
        body.call = call
        return fn
    return declare


def collective(call: Any) -> bool:
    """Whether every member of the group makes ``call``: a declared call with a fingerprint, or an
    exchange of mpidist's own named by a string (the cross-rank check's); ``False`` for
    point-to-point calls, which have no number of their own in ``ProcessGroup.seq`` and no ticket."""
    return not isinstance(call, Call) or call.fingerprint is not None


def of(name: str) -> Call:
    """The :class:`Call` declared as ``name`` (``KeyError`` if none)."""
    return REGISTRY[name]


def outermost_call(frame: FrameType | None) -> tuple[Call, FrameType] | None:
    """The outermost declared call on the stack that ends in ``frame``, and its frame."""
    found = None
    while frame is not None:
        c = _CODES.get(frame.f_code)
        if c is not None:
            found = (c, frame)
        frame = frame.f_back
    return found
