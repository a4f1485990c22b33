"""Where this process stands in a torchrun job: its rank, the world size and its rank on the node,
read from the environment torchrun sets (one process alone: rank 0 of 1). The one place they are
read, as nanochat's `get_dist_info`; `train.init_distributed` joins the process group from it."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes shared files and prints."""
        return self.rank == 0


def dist_info() -> DistInfo:
    env = os.environ
    return DistInfo(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")))
