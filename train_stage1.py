"""Same as `ript stage1 [hydra overrides]`."""

import sys

from ript.cli import app

if __name__ == "__main__":
    app(["stage1", *sys.argv[1:]], prog_name="train_stage1.py")
