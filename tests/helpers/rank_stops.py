"""Under torchrun: rank 1 fails at once while rank 0 waits, so that torchrun stops rank 0 (SIGTERM)."""

import sys
import time

from ript.utils.distributed import init_rank


def waiting_for_nothing() -> None:
    time.sleep(120)


if __name__ == "__main__":
    _, info = init_rank("cpu")
    if info.rank == 1:
        sys.exit(3)
    waiting_for_nothing()
