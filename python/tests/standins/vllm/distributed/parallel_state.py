# Stand-in for vllm/distributed/parallel_state.py at vllm-project/vllm@0c175ae9295b575078961a68c4d3a2a838dce5ef; only what kiln's loader touches.
"""get_world_group(): the world GroupCoordinator. Upstream builds it in
init_distributed_environment with rank, ranks, world_size, rank_in_group, local_rank, a
device_group (the backend's, e.g. NCCL) and a cpu_group: a separate gloo group over the same
ranks (torch.distributed.new_group(ranks, backend="gloo")). The stand-in makes one from
whatever torch.distributed process group is initialized, with cpu_group and device_group
both torch.distributed.group.WORLD (tests initialize gloo, so that is a gloo group too); it
is rebuilt on each call, so it follows a test that re-initializes the process group. As
upstream, asking before initialization fails the assertion "world group is not initialized"."""

import os

import torch.distributed as dist

__all__ = ["GroupCoordinator", "get_world_group"]


class GroupCoordinator:
    rank: int
    ranks: list
    world_size: int
    local_rank: int
    rank_in_group: int

    def __init__(self, group, local_rank: int):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(group)
        self.ranks = list(range(self.world_size))
        self.rank_in_group = dist.get_rank(group)
        self.local_rank = local_rank
        self.cpu_group = group
        self.device_group = group

    @property
    def first_rank(self):
        return self.ranks[0]

    @property
    def is_first_rank(self):
        return self.rank == self.first_rank


def get_world_group() -> GroupCoordinator:
    assert dist.is_available() and dist.is_initialized(), "world group is not initialized"
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return GroupCoordinator(dist.group.WORLD, local_rank)
