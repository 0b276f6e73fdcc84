"""One job, many checks: run across the nodes of a test cluster by tests/cluster/test_cluster.py.

    mpiexec ... -hosts node0:2,node1:1 -n 3 python tests/cluster/job_checks.py 2,1 node0,node1

argv: the ranks per node and the host names, in node order (and ``layout`` to check only
init_distributed_mode's layout). Every check compares what
mpidist returns with numpy on inputs gathered by plain mpi4py (``allgather`` of pickles),
over the world and over node-local, one-rank-per-node and unevenly spanning groups. A
wrong value prints ``FAIL <check> on rank R: ...`` and the job goes on (the collective
itself has completed); rank 0 ends with ``CHECKS: N passed, M failed`` and the exit status
says whether any rank failed. An exception other than a wrong value ends the job.
"""

from __future__ import annotations

import sys
import traceback

import numpy as np
from mpi4py import MPI

import mpidist as dist
import mpidist.groupby as gb

RAW = MPI.COMM_WORLD  # the independent path: plain mpi4py, never mpidist
layout = [int(x) for x in sys.argv[1].split(",")]
hostnames = sys.argv[2].split(",") if len(sys.argv) > 2 else None
starts = np.concatenate([[0], np.cumsum(layout)[:-1]]).tolist()
passed = failed = 0


def check(name: str, fn, *args) -> None:
    global passed, failed
    try:
        fn(*args)
    except AssertionError as exc:
        failed += 1
        print(f"FAIL {name} on rank {RAW.rank}: {exc}\n{traceback.format_exc(limit=3)}", flush=True)
    else:
        passed += 1


def data(r: int, shape, dtype, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed * 1009 + r)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


RAW_GROUP = RAW


def gathered_members(x, ranks) -> list:
    """Every member's ``x``, in group-rank order, by plain mpi4py over the members' own communicator."""
    return RAW_GROUP.allgather(x)


# -- layout -----------------------------------------------------------------------------
def expected_place(r: int) -> tuple[int, int, int]:
    node = max(i for i, s in enumerate(starts) if r >= s)
    return node, r - starts[node], layout[node]


def check_layout(info) -> None:
    node, local, local_size = expected_place(RAW.rank)
    got = (info.rank, info.world_size, info.local_rank, info.local_world_size, info.node_rank, info.num_nodes)
    want = (RAW.rank, sum(layout), local, local_size, node, len(layout))
    assert got == want, f"DistInfo (rank, world, local, local_size, node, nodes) {got} != {want}"
    if hostnames:
        assert MPI.Get_processor_name() == hostnames[node], (MPI.Get_processor_name(), hostnames[node])
    everyone = RAW.allgather((got, MPI.Get_processor_name()))
    hosts_of_node: dict[int, set] = {}
    for (_, _, _, _, nrank, _), host in everyone:
        hosts_of_node.setdefault(nrank, set()).add(host)
    assert all(len(h) == 1 for h in hosts_of_node.values()), f"a node_rank spans hosts: {hosts_of_node}"
    assert len({next(iter(h)) for h in hosts_of_node.values()}) == len(layout), hosts_of_node


# -- collectives over a group ---------------------------------------------------------------
def run_group_checks(label: str, g, ranks: list[int], seed: int) -> None:
    """Every collective, object call and p2p pattern on group ``g`` (members only)."""
    n, me = len(ranks), ranks.index(RAW.rank)
    x = data(RAW.rank, (5, 7), np.float64, seed)
    xs = np.stack(gathered_members(x, ranks))
    big = data(RAW.rank, (150_000,), np.float32, seed + 1)  # past the eager limit: rendezvous over TCP
    bigs = np.stack(gathered_members(big, ranks))

    for opname, ref in (("SUM", np.sum), ("MAX", np.max), ("MIN", np.min), ("AVG", np.mean)):
        t = x.copy()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, opname), group=g)
        check(f"{label} all_reduce {opname}", np.testing.assert_allclose, t, ref(xs, axis=0), 1e-12)
    ints = data(RAW.rank, (6,), np.int64, seed + 2) % 3 + 1
    prod = ints.copy()
    dist.all_reduce(prod, op=dist.ReduceOp.PRODUCT, group=g)
    check(f"{label} all_reduce PRODUCT", np.testing.assert_array_equal, prod,
          np.prod(np.stack(gathered_members(ints, ranks)), axis=0))
    t = big.copy()
    dist.all_reduce(t, group=g)
    check(f"{label} all_reduce large", np.testing.assert_allclose, t, bigs.sum(0), 1e-5, 1e-5)
    half = x.astype(np.float16)
    dist.all_reduce(half, group=g)
    check(f"{label} all_reduce float16", np.testing.assert_allclose, half.astype(np.float32),
          np.stack(gathered_members(x.astype(np.float16), ranks)).astype(np.float32).sum(0), 2e-2, 2e-2)
    t = x.copy()
    work = dist.all_reduce(t, group=g, async_op=True)
    work.wait()
    check(f"{label} all_reduce async", np.testing.assert_allclose, t, xs.sum(0), 1e-12)

    t = big.copy()
    dist.broadcast(t, src=ranks[-1], group=g)
    check(f"{label} broadcast large", np.testing.assert_array_equal, t, bigs[-1])
    t = x.copy()
    dist.reduce(t, dst=ranks[-1], group=g)
    if me == n - 1:
        check(f"{label} reduce", np.testing.assert_allclose, t, xs.sum(0), 1e-12)

    out = [np.empty_like(x) for _ in range(n)]
    dist.all_gather(out, x, group=g)
    check(f"{label} all_gather", np.testing.assert_array_equal, np.stack(out), xs)
    flat = np.empty((n * big.size,), big.dtype)
    dist.all_gather_into_tensor(flat, big, group=g)
    check(f"{label} all_gather_into_tensor", np.testing.assert_array_equal, flat, bigs.reshape(-1))
    glist = [np.empty_like(x) for _ in range(n)] if me == 0 else None
    dist.gather(x, glist, dst=ranks[0], group=g)
    if me == 0:
        check(f"{label} gather", np.testing.assert_array_equal, np.stack(glist), xs)
    pieces = [data(ranks[-1], (3,), np.float64, seed + 10 + j) for j in range(n)]
    got = np.empty(3)
    dist.scatter(got, pieces if me == n - 1 else None, src=ranks[-1], group=g)
    check(f"{label} scatter", np.testing.assert_array_equal, got, pieces[me])

    rs_in = [data(RAW.rank, (4,), np.float64, seed + 20 + j) for j in range(n)]
    rs_out = np.empty(4)
    dist.reduce_scatter(rs_out, rs_in, group=g)
    every = gathered_members(rs_in, ranks)
    check(f"{label} reduce_scatter", np.testing.assert_allclose, rs_out, sum(e[me] for e in every), 1e-12)
    rst_in = data(RAW.rank, (n * 5,), np.float64, seed + 30)
    rst_out = np.empty(5)
    dist.reduce_scatter_tensor(rst_out, rst_in, group=g)
    check(f"{label} reduce_scatter_tensor", np.testing.assert_allclose, rst_out,
          np.stack(gathered_members(rst_in, ranks)).sum(0)[me * 5:(me + 1) * 5], 1e-12)

    a2a_in = [np.full(2, 100 * RAW.rank + j, np.int64) for j in range(n)]
    a2a_out = [np.empty(2, np.int64) for _ in range(n)]
    dist.all_to_all(a2a_out, a2a_in, group=g)
    check(f"{label} all_to_all", np.testing.assert_array_equal, np.stack(a2a_out),
          np.stack([np.full(2, 100 * r + me) for r in ranks]))
    # uneven splits: group rank i sends i + j + 1 rows of 3 to group rank j
    send_splits = [me + j + 1 for j in range(n)]
    recv_splits = [i + me + 1 for i in range(n)]
    src_rows = data(RAW.rank, (sum(send_splits), 3), np.float64, seed + 40)
    dst_rows = np.empty((sum(recv_splits), 3))
    dist.all_to_all_single(dst_rows, src_rows, recv_splits, send_splits, group=g)
    all_src = gathered_members(src_rows, ranks)
    want = [all_src[i][sum(i + j + 1 for j in range(me)):][:i + me + 1] for i in range(n)]
    check(f"{label} all_to_all_single uneven", np.testing.assert_array_equal, dst_rows, np.concatenate(want))

    dist.barrier(group=g)
    dist.monitored_barrier(group=g, timeout=60)

    # objects
    objs: list = [None] * n
    dist.all_gather_object(objs, {"rank": RAW.rank, "host": MPI.Get_processor_name()}, group=g)
    check(f"{label} all_gather_object", lambda: _eq([o["rank"] for o in objs], ranks))
    gobjs = [None] * n if me == 0 else None
    dist.gather_object(("g", RAW.rank), gobjs, dst=ranks[0], group=g)
    if me == 0:
        check(f"{label} gather_object", lambda: _eq(gobjs, [("g", r) for r in ranks]))
    blist = [{"from": RAW.rank, "arr": big[:10]}, "x"] if me == n - 1 else [None, None]
    dist.broadcast_object_list(blist, src=ranks[-1], group=g)
    check(f"{label} broadcast_object_list", lambda: _eq((blist[0]["from"], blist[1]), (ranks[-1], "x")))
    sout: list = [None]
    dist.scatter_object_list(sout, [f"for {r}" for r in ranks] if me == 0 else None, src=ranks[0], group=g)
    check(f"{label} scatter_object_list", lambda: _eq(sout[0], f"for {RAW.rank}"))

    if n == 1:
        return
    # p2p: a ring, tensors and objects
    right, left = ranks[(me + 1) % n], ranks[(me - 1) % n]
    got = np.empty_like(big)
    if me % 2 == 0:
        dist.send(big, dst=right, group=g)
        dist.recv(got, src=left, group=g)
    else:
        dist.recv(got, src=left, group=g)
        dist.send(big, dst=right, group=g)
    check(f"{label} send/recv ring", np.testing.assert_array_equal, got, bigs[(me - 1) % n])
    got = np.empty_like(x)
    reqs = [dist.isend(x, dst=right, group=g, tag=7), dist.irecv(got, src=left, group=g, tag=7)]
    for w in reqs:
        w.wait()
    check(f"{label} isend/irecv", np.testing.assert_array_equal, got, xs[(me - 1) % n])
    got = np.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, right, g), dist.P2POp(dist.irecv, got, left, g)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(f"{label} batch_isend_irecv", np.testing.assert_array_equal, got, xs[(me - 1) % n])
    olist: list = [None]
    if me % 2 == 0:
        dist.send_object_list([("obj", RAW.rank)], dst=right, group=g)
        dist.recv_object_list(olist, src=left, group=g)
    else:
        dist.recv_object_list(olist, src=left, group=g)
        dist.send_object_list([("obj", RAW.rank)], dst=right, group=g)
    check(f"{label} send/recv_object_list", lambda: _eq(olist[0], ("obj", left)))
    # ANY_SOURCE: group rank 0 receives from every other member in arrival order
    if me == 0:
        senders = []
        for _ in range(n - 1):
            buf = np.empty(1, np.int64)
            src = dist.recv(buf, group=g, tag=11)
            senders.append(src)
            check(f"{label} recv ANY_SOURCE value", np.testing.assert_array_equal, buf, [src * 10])
        check(f"{label} recv ANY_SOURCE senders", lambda: _eq(sorted(senders), ranks[1:]))
    else:
        dist.send(np.array([RAW.rank * 10], np.int64), dst=ranks[0], group=g, tag=11)


def _eq(a, b) -> None:
    assert a == b, f"{a!r} != {b!r}"


def on_group(label: str, ranks: list[int], g, seed: int) -> None:
    """Run the group checks on the members of ``ranks`` (every rank of the world calls this).

    The members' inputs are gathered over a communicator of their own, split from
    ``MPI_COMM_WORLD`` by plain mpi4py: the reference never passes through mpidist.
    """
    global RAW_GROUP
    member = RAW.rank in ranks
    sub = RAW.Split(0 if member else MPI.UNDEFINED, RAW.rank)
    if not member:
        return
    RAW_GROUP = sub
    try:
        check(f"{label} ranks", lambda: _eq(dist.get_process_group_ranks(g), ranks))
        run_group_checks(label, g, ranks, seed)
    finally:
        sub.Free()


# -- topology ---------------------------------------------------------------------------------
def node_blocks() -> list[list[int]]:
    return [list(range(s, s + k)) for s, k in zip(starts, layout)]


def check_topology() -> tuple:
    blocks = node_blocks()
    check("node_ranks", lambda: _eq(dist.node_ranks(), blocks))
    node_g = dist.new_node_group()
    mine = next(b for b in blocks if RAW.rank in b)
    check("new_node_group", lambda: _eq(dist.get_process_group_ranks(node_g), mine))
    cur, allg = dist.new_subgroups_by_local_rank()
    local = RAW.rank - mine[0]
    column = [b[local] for b in blocks if local < len(b)]
    check("new_subgroups_by_local_rank", lambda: _eq(dist.get_process_group_ranks(cur), column))
    check("new_subgroups_by_local_rank count", lambda: _eq(len(allg), max(layout)))
    # new_subgroups() defaults to the ranks per node: on uneven nodes every rank must raise
    try:
        sub, _ = dist.new_subgroups()
    except ValueError as exc:
        msg = str(exc)
        check("new_subgroups() on uneven nodes raises", lambda: _eq(
            (len(set(layout)) > 1, "nodes hold" in msg), (True, True)))
    else:
        check("new_subgroups() on even nodes", lambda: _eq(dist.get_process_group_ranks(sub), mine))
    if len(set(layout)) == 1:
        check("node_mesh", lambda: _eq(dist.node_mesh(), blocks))
    else:
        try:
            dist.node_mesh()
        except ValueError as exc:
            msg = str(exc)
            check("node_mesh uneven raises", lambda: _eq("different numbers of ranks" in msg, True))
        else:
            check("node_mesh uneven raises", lambda: _eq("no error", "ValueError"))
    return node_g, cur, mine, column


# -- groupby ------------------------------------------------------------------------------------
def check_groupby() -> None:
    rng = np.random.default_rng(500 + RAW.rank)
    rows = 50 + 37 * RAW.rank
    keys = rng.integers(0, 25, rows)
    vals = rng.standard_normal(rows)
    everyone = RAW.allgather((keys, vals))
    all_k = np.concatenate([k for k, _ in everyone])
    all_v = np.concatenate([v for _, v in everyone])
    uniq = np.unique(all_k)
    sums = np.array([all_v[all_k == k].sum() for k in uniq])
    counts = np.array([(all_k == k).sum() for k in uniq])
    root = RAW.size - 1
    res = gb.aggregate(keys, {"v": vals}, ["sum", "count"], merge="root", root=root)
    if RAW.rank == root:
        res = res.sort()
        check("groupby root keys", np.testing.assert_array_equal, res["key"], uniq)
        check("groupby root sum", np.testing.assert_allclose, res[("v", "sum")], sums, 1e-12)
        check("groupby root count", np.testing.assert_array_equal, res[("v", "count")], counts)
    else:
        check("groupby root non-root None", lambda: _eq(res, None))
    res = gb.aggregate(keys, {"v": vals}, ["sum", "count"], merge="shuffle")
    parts = RAW.allgather((res["key"], res[("v", "sum")], res[("v", "count")]))
    got_k = np.concatenate([p[0] for p in parts])
    order = np.argsort(got_k)
    check("groupby shuffle each key once", np.testing.assert_array_equal, got_k[order], uniq)
    check("groupby shuffle sum", np.testing.assert_allclose,
          np.concatenate([p[1] for p in parts])[order], sums, 1e-12)
    check("groupby shuffle count", np.testing.assert_array_equal,
          np.concatenate([p[2] for p in parts])[order], counts)


# -- DETAIL debug mode --------------------------------------------------------------------------
def check_detail() -> None:
    dist.set_debug_level("DETAIL")
    try:
        x = data(RAW.rank, (4,), np.float64, 900)
        xs = np.stack(RAW.allgather(x))
        t = x.copy()
        dist.all_reduce(t)
        check("DETAIL all_reduce", np.testing.assert_allclose, t, xs.sum(0), 1e-12)
        t = x.copy()
        dist.broadcast(t, src=RAW.size - 1)
        check("DETAIL broadcast", np.testing.assert_array_equal, t, xs[-1])
        objs: list = [None] * RAW.size
        dist.all_gather_object(objs, RAW.rank)
        check("DETAIL all_gather_object", lambda: _eq(objs, list(range(RAW.size))))
        # the last rank (on the last node) passes another shape: every rank must raise the same error
        bad = np.zeros(5 if RAW.rank == RAW.size - 1 else 4)
        try:
            dist.all_reduce(bad)
        except ValueError as exc:
            msg = str(exc)
            check("DETAIL mismatch names the rank", lambda: _eq(f"rank {RAW.size - 1} passed" in msg, True))
        else:
            check("DETAIL mismatch raises", lambda: _eq("no error", "ValueError"))
        t = x.copy()
        dist.all_reduce(t)  # the runtime stays usable
        check("DETAIL after mismatch", np.testing.assert_allclose, t, xs.sum(0), 1e-12)
    finally:
        dist.set_debug_level("OFF")


def main() -> int:
    info = dist.init_distributed_mode(quiet_non_master=False)
    check("layout", check_layout, info)
    if RAW.allreduce(failed):  # every later check builds its groups from the layout
        return 1
    if sys.argv[3:4] == ["layout"]:  # only the layout (the Slurm tests)
        if RAW.rank == 0:
            print(f"LAYOUT OK {info.launcher}: {sum(layout)} ranks as {layout} on {hostnames}", flush=True)
        return 0
    world = list(range(RAW.size))
    on_group("world", world, dist.group.WORLD, 1)
    node_g, local_g, node_members, column = check_topology()
    # the node groups and local-rank groups: every rank is in exactly one of each
    for label, g, members in (("node", node_g, node_members), ("local-rank", local_g, column)):
        lists = RAW.allgather(members)
        for ranks in sorted({tuple(m) for m in lists}):
            on_group(f"{label} {list(ranks)}", list(ranks), g if list(ranks) == members else None, 2)
    # a group spanning the nodes unevenly: all of node 0 plus the last rank of the last node
    span = sorted(set(node_blocks()[0]) | {RAW.size - 1})
    g = dist.new_group(span)
    on_group(f"uneven {span}", span, g, 3)
    # subgroups by enumeration and split_group: the first rank of each node vs. the rest
    firsts = [b[0] for b in node_blocks()]
    rest = [r for r in world if r not in firsts]
    enum = [firsts, rest] if rest else [firsts]
    cur, _ = dist.new_subgroups_by_enumeration(enum)
    for ranks in enum:
        on_group(f"enumeration {ranks}", ranks, cur if RAW.rank in ranks else None, 4)
    sg = dist.split_group(split_ranks=enum)
    for ranks in enum:
        on_group(f"split_group {ranks}", ranks, sg if RAW.rank in ranks else None, 5)
    check_groupby()
    check_detail()
    totals = RAW.reduce(np.array([passed, failed]), root=0)
    if RAW.rank == 0:
        print(f"CHECKS: {totals[0]} passed, {totals[1]} failed", flush=True)
    return 1 if RAW.allreduce(failed) else 0


if __name__ == "__main__":
    sys.exit(main())
