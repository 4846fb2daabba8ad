"""How much of a stage-0 code is the collection's label noise: the tokens of the scripted expert's clean
32-step chunks against the same chunks with the collection noise added (two independent draws).

    MUJOCO_GL=egl python -m benchmarks.label_noise_tokens <stage-0 or stage-1 checkpoint> \
        [--suite libero_object] [--tasks salad_dressing butter] [--episodes 3] [--noise 0.05]

Each episode is the collection's own \
(``ript.experts.libero.episode.run_episode``: a demo layout, its noise draws), which
records the expert's clean command beside the executed (noisy) action every step; chunks start every 8 steps.
Printed per episode and on average: the share of token positions where clean == executed and where executed ==
another noise draw around the clean chunk (the token accuracy a prior trained on executed actions could reach
even knowing the clean plan), and the L1 of each decoded chunk against the clean one. LIBERO-Object,
15,000-step stage 0: 7.5% and 5.1% (the collection's draws; the script's own draws: 9.2% and 4.6%).
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--tasks", nargs="+", default=["salad_dressing", "butter"],
                   help="LIBERO-Object object names, or full task names of --suite")
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--noise", type=float, default=0.05, help="as the LIBERO task configs' expert_noise")
    p.add_argument("--stride", type=int, default=8)
    a = p.parse_args()

    from benchmarks.autoencoder_loop import decoded_tokens, encoded
    from ript.data.hdf5 import EXPERT_ACTIONS
    from ript.envs.libero import LiberoTask
    from ript.envs.seeds import demo_layout_seed, demo_noise_rng
    from ript.experts.libero.episode import run_episode
    from ript.model_loader import load_model

    model, ckpt = load_model(a.checkpoint)
    autoencoder = (model if ckpt["stage"] == "stage0" else model.autoencoder).eval()
    chunk = autoencoder.chunk_size

    rng = np.random.default_rng(0)
    rows = []
    for name in a.tasks:
        full = name if "_and_" in name else f"pick_up_the_{name}_and_place_it_in_the_basket"
        task = LiberoTask(a.suite, full, None)
        for e in range(a.episodes):
            # the collection's own episode and noise draws: it records the clean command beside the executed one
            noise_rng = demo_noise_rng(0, full, e, 0)
            demo = run_episode(task, demo_layout_seed(0, e, 0), noise_rng, a.noise, render=False)
            clean, executed = demo.extra[EXPERT_ACTIONS], demo.actions
            starts = range(0, len(clean) - chunk, a.stride)
            c = [np.stack(clean[t:t + chunk]) for t in starts]
            x = [np.stack(executed[t:t + chunk]) for t in starts]
            y = [np.concatenate([np.clip(k[:, :6] + rng.normal(0.0, a.noise, (chunk, 6)), -1, 1), k[:, 6:]], 1)
                 .astype(np.float32) for k in c]
            tc, tx, ty = (encoded(autoencoder, np.stack(k)) for k in (c, x, y))
            row = ((tc == tx).mean(), (tx == ty).mean(), np.abs(decoded_tokens(autoencoder, tc) - np.stack(c)).mean(),
                   np.abs(decoded_tokens(autoencoder, tx) - np.stack(c)).mean())
            rows.append(row)
            print(f"{full[:40]} episode {e} (success {demo.attrs['success']}, {len(clean)} steps): tokens "
                  f"clean==executed {row[0]:.3f}, executed==another draw {row[1]:.3f}; L1 to the clean chunk: "
                  f"decoded clean {row[2]:.4f}, decoded executed {row[3]:.4f}", flush=True)
        task.close()
    m = np.mean(rows, axis=0)
    print(f"average: tokens clean==executed {m[0]:.3f}, executed==another draw {m[1]:.3f}; L1 decoded clean "
          f"{m[2]:.4f}, decoded executed {m[3]:.4f}")


if __name__ == "__main__":
    main()
