"""Process-group setup for torchrun launches, and model wrapping (DDP or FSDP2).

A single process (no torchrun) is world size 1 with no process group. Under torchrun
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT set by its rendezvous), the group uses nccl on
CUDA and gloo on the CPU; multi-node runs use torchrun's standard ``--nnodes --node-rank
--rdzv-backend c10d --rdzv-endpoint HOST:PORT`` flags and need nothing else from swax.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from swax.core.memory import trim
from swax.core.settings import resolve_device


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto", backend: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Initialise the process group when launched by torchrun; pick the device."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device)
    if dev.type == "cuda":
        if dev.index is None:  # each torchrun process on its own GPU
            dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    if world > 1 and not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if dev.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        kw = {}
        store = _attempt_store(world, timeout)
        if store is not None:
            kw = dict(store=store, rank=rank, world_size=world)
        dist.init_process_group(
            backend=backend,
            device_id=dev if dev.type == "cuda" else None,
            timeout=timeout,
            **kw,
        )
    return DistInfo(rank, world, local, dev)


def _attempt_store(world: int, timeout: datetime.timedelta):
    """Under torchrun (the agent's store), a store whose keys are this restart's own. torch
    reuses the agent's store across restarts without a prefix per attempt, so a restarted gloo
    group could read a dead worker's address from the attempt before and never connect (seen
    under --max-restarts after one rank was killed). None outside torchrun."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"swax/attempt_{attempt}", store)


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def _fully_shard(model: nn.Module) -> nn.Module:
    """FSDP2: fully_shard on each block, then on the root (embedding, final norm, head)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.5
        from torch.distributed._composable.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def wrap_model(model: nn.Module, info: DistInfo, strategy: str) -> nn.Module:
    """DDP or FSDP2 (fully_shard on each block, then the root) when distributed."""
    if not info.distributed:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    if strategy == "fsdp":
        return _fully_shard(model)
    raise ValueError(f"unknown dist.strategy {strategy!r}; expected ddp or fsdp")


def _keep_shards(part: nn.Module, full: nn.Module, info: DistInfo, name: str) -> None:
    """Copy this rank's FSDP2 shard (dim-0 chunk) of each of ``full``'s parameters into
    ``part``'s (a function, so that no reference to the full tensors outlives it)."""
    from torch.distributed.tensor import DTensor, Shard

    for pname, p in part.named_parameters():
        value = full.get_parameter(pname)
        if not isinstance(p, DTensor):
            p.copy_(value)
            continue
        if tuple(p.placements) != (Shard(0),):
            raise RuntimeError(f"{name}.{pname}: unexpected placements {p.placements}")
        local = p.to_local()
        chunks = value.chunk(info.world_size, dim=0)
        mine = chunks[info.rank] if info.rank < len(chunks) else value[:0]
        if mine.shape != local.shape:
            raise RuntimeError(
                f"{name}.{pname}: shard {tuple(local.shape)} is not the chunk {tuple(mine.shape)}"
            )
        local.copy_(mine)


def build_sharded(config, info: DistInfo, seed: int) -> nn.Module:
    """A SwaxLM sharded by FSDP2 without a whole model on any rank: built on the meta device,
    sharded block by block, then each part (the embedding, each block, the norm, the head; the
    order of :meth:`SwaxLM.init_parts`) is initialised in full on the CPU, one at a time, from
    the seed's random stream, and each rank keeps its shard of it. The weights equal those of
    an unsharded ``torch.manual_seed(seed); SwaxLM(config)``; a rank holds its shards plus one
    part at a time (the largest: the embedding, or a block)."""
    from swax.model import SwaxLM

    with torch.device("meta"):
        model = SwaxLM(config)
        twin = SwaxLM(config)  # the unsharded shapes each part is drawn in
    _fully_shard(model)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, init in twin.init_parts():
            full = twin.get_submodule(name).to_empty(device="cpu")
            init(full)
            part = model.get_submodule(name)
            part.to_empty(device=info.device)
            _keep_shards(part, full, info, name)
            full.to_empty(device="meta")  # the part's full copy goes before the next is made
            trim()
    return model
