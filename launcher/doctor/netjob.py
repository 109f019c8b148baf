"""`inv doctor --net`'s job: it runs on every node under torchrun, one rank a node (or one a GPU: --net-all-gpus),
with the run's own backend (NCCL where there are GPUs, else gloo). The controller never imports it: it is sent as
`python -c` source (launcher/doctor/net.py), so nothing of it has to be on a node. It needs torch and the standard
library only.

It measures, and rank 0 prints one `NETCHECK {json}` line:
- the whole group: an all_reduce of each size in turn, its time and bus bandwidth (nccl-tests' busbw: 2(n-1)/n x
  bytes / time), the smallest size's time as the latency; a size is skipped once the one before it took over the
  budget (the check ends in seconds);
- a ring of pairs, one pair at a time while the others wait: each node with the next, an all_reduce of a few MB
  and of a few bytes in a group of the two nodes' ranks, so a slow node or link shows in the two pairs it is part of;
- the same compute on every node, in its pairs' steps (matrix products on the run's device), so a node whose own
  CPU or GPU is slow is told from one whose network is.
argv: sizes (bytes, comma-separated), seconds a size may take, pair bytes, most iterations of one size.
"""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def timed(tensor, budget_s, most, group=None, src=0):
    """Seconds one all_reduce of `tensor` takes, over as many runs as fit the budget (rank 0's first run
    decides, so every rank runs the same count), the slowest rank's."""
    device = tensor.device

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.all_reduce(tensor, group=group)  # a first run: connections made, buffers allocated
    sync()
    dist.barrier(group=group)
    start = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    sync()
    first = time.perf_counter() - start
    count = torch.tensor([min(most, max(1, int(budget_s / max(first, 1e-6))))], device=device)
    dist.broadcast(count, src=src, group=group)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(int(count.item())):
        dist.all_reduce(tensor, group=group)
    sync()
    took = torch.tensor([(time.perf_counter() - start) / int(count.item())], device=device, dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX, group=group)
    return float(took.item())


def compute_s(device, group):
    """Seconds of a fixed compute here (matrix products, ~0.1 s on a CPU core: longer than a scheduler's or a CPU
    quota's period), run with the other member of `group` at the same time: a node's own speed, timed where no other
    node of the measurement computes (on one machine, as the sandbox's nodes are, they would share its cores)."""
    a = torch.randn(256, 256, device=device)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(200):
        b = a @ a
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del b
    return time.perf_counter() - start


def machine_id():
    """Which machine this rank runs on (Linux's boot id): nodes on one machine share its cores, so their compute is
    not compared (the sandbox's nodes are one machine's processes)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return None


def gather_json(value, device):
    """Every rank's `value`, in rank order, through JSON in byte tensors: all_gather_object would need numpy,
    which a node's venv need not have."""
    data = json.dumps(value).encode()
    size = torch.tensor([len(data)], device=device)
    dist.all_reduce(size, op=dist.ReduceOp.MAX)
    mine = torch.zeros(int(size.item()), dtype=torch.uint8, device=device)
    mine[: len(data)] = torch.tensor(list(data), dtype=torch.uint8, device=device)
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return [json.loads(bytes(t.tolist()).rstrip(b"\0")) for t in every]


def gbps(nbytes, seconds, ranks):
    """Bus bandwidth in Gbit/s: what each rank's link carried (nccl-tests' busbw), whatever the group's size."""
    return 2.0 * (ranks - 1) / ranks * nbytes * 8 / seconds / 1e9


def whole_group(sizes, budget_s, most, device, world):
    """The whole group's all_reduce at each size; a size after one over the budget is skipped."""
    group, skip = [], False
    for size in sizes:
        go = torch.tensor([0 if skip else 1], device=device)
        dist.broadcast(go, src=0)
        if not go.item():
            group.append({"bytes": size, "skipped": True})
            continue
        took = timed(torch.ones(max(1, size // 4), dtype=torch.float32, device=device), budget_s, most)
        group.append({"bytes": size, "time_s": took, "busbw_gbps": gbps(size, took, world)})
        skip = took > budget_s
    return group


def node_pairs(nodes, budget_s, pair_bytes, most, device):
    """Each node with the next, one pair at a time: every rank of the two (one a GPU with --net-all-gpus) in a group
    of their own. (this rank's pairs, its compute's times)."""
    rank = dist.get_rank()
    order = list(dict.fromkeys(nodes))  # the nodes in rank order, once each
    pairs, computed = [], []
    for i in range(len(order) if len(order) > 2 else len(order) - 1):
        ends = [order[i], order[(i + 1) % len(order)]]
        members = [r for r, n in enumerate(nodes) if n in ends]
        pair = dist.new_group(members)  # every rank makes every group, in the same order
        if rank in members:
            took = timed(
                torch.ones(pair_bytes // 4, dtype=torch.float32, device=device), budget_s, most, pair, members[0]
            )
            small = timed(torch.ones(2, dtype=torch.float32, device=device), budget_s / 4, most, pair, members[0])
            pairs.append(
                {"nodes": ends, "busbw_gbps": gbps(pair_bytes, took, len(members)), "latency_ms": small * 1000}
            )
            computed.append(compute_s(device, pair))
        dist.barrier()
    return pairs, computed


def per_node(nodes, values, pick):
    """{node: `pick` of its ranks' values} (the slowest rank's compute, a node's machine)."""
    found = {}
    for node, value in zip(nodes, values, strict=True):
        if value is not None:
            found.setdefault(node, []).append(value)
    return {node: pick(got) for node, got in found.items()}


def main():
    sizes = [int(s) for s in sys.argv[1].split(",")]
    budget_s, pair_bytes, most = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda") if cuda else torch.device("cpu")
    node = os.environ.get("DDP_LAUNCHER_RUN", "/?").partition("/")[2]
    nodes = gather_json(node, device)  # each rank's node
    group = whole_group(sizes, budget_s, most, device, world)
    pairs, computed = node_pairs(nodes, budget_s, pair_bytes, most, device)
    found = gather_json(pairs, device)
    compute = gather_json(min(computed) if computed else None, device)
    machines = gather_json(machine_id(), device)
    if rank == 0:
        unique = {tuple(p["nodes"]): p for ps in found for p in ps}
        print(
            "NETCHECK "
            + json.dumps(
                {
                    "backend": "nccl" if cuda else "gloo",
                    "world": world,
                    "nodes": list(dict.fromkeys(nodes)),
                    "ranks": len(nodes),
                    "group": group,
                    "pairs": list(unique.values()),
                    "compute_s": per_node(nodes, compute, max),
                    "machines": per_node(nodes, machines, lambda got: got[0]),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
