"""Same as `ript rl [hydra overrides]`."""

import sys

from ript.cli import app

if __name__ == "__main__":
    app(["rl", *sys.argv[1:]], prog_name="train_rl.py")
