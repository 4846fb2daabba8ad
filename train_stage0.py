"""Same as `ript stage0 [hydra overrides]`."""

import sys

from ript.cli import app

if __name__ == "__main__":
    app(["stage0", *sys.argv[1:]], prog_name="train_stage0.py")
