import pytest
import torch

from ript.errors import RiptError
from ript.models.action_autoencoder import ActionAutoencoder
from ript.models.encoders import ResNetEncoder, color_jitter, random_shift
from ript.models.prior import SkillPrior, processed_log_probs

AE = dict(action_dim=4, chunk_size=16, downsample=4, dim=32, n_head=2, enc_layers=1, dec_layers=1, dropout=0.0)


def make_prior(**kw):
    torch.manual_seed(0)
    kw.setdefault("encoder_stages", 2)  # 32 px images: four stages would leave a single cell
    return SkillPrior(autoencoder=AE, task_names=["a", "b"], image_keys=["cam_rgb"], lowdim_dims={"state": 3},
                      lang_dim=8, frame_stack=2, dim=32, n_layer=2, n_head=2, dropout=0.0, encoder_width=8,
                      num_kp=4, **kw).eval()


def obs(b=3):
    return {"cam_rgb": torch.randint(0, 255, (b, 2, 32, 32, 3), dtype=torch.uint8), "state": torch.randn(b, 2, 3)}


@pytest.mark.parametrize("quantizer", ["fsq", "vq"])
def test_autoencoder_tokens_and_reconstruction(quantizer):
    ae = ActionAutoencoder(**AE, quantizer=quantizer, vq_codebook_size=64, vq_dim=8)
    actions = torch.rand(5, 16, 4) * 2 - 1
    ae(actions)["loss"].backward()
    ae.eval()  # VQ's EMA codebook moves on every training forward
    out = ae(actions)
    assert out["indices"].shape == (5, 4) and out["recon"].shape == (5, 16, 4)
    assert int(out["indices"].max()) < ae.codebook_size
    assert torch.allclose(ae.decode_indices(out["indices"]), out["recon"], atol=1e-5)


def test_autoencoder_is_causal():
    ae = ActionAutoencoder(**AE).eval()
    a = torch.rand(1, 16, 4)
    b = a.clone()
    b[:, 12:] = -a[:, 12:]  # change only the last token's window
    za, zb = ae.latents(a), ae.latents(b)
    assert torch.allclose(za[:, :3], zb[:, :3]) and not torch.allclose(za[:, 3], zb[:, 3])


def test_bad_downsample_is_refused():
    with pytest.raises(RiptError, match="downsample=3"):
        ActionAutoencoder(**{**AE, "downsample": 3})


def test_kv_cache_sampling_matches_full_recompute():
    prior = make_prior()
    ctx = prior.context(obs(), torch.tensor([0, 1, 0]))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    idx1, lp1 = prior.sample(ctx, 1.0, 5, use_cache=True, generator=g1)
    idx2, lp2 = prior.sample(ctx, 1.0, 5, use_cache=False, generator=g2)
    assert torch.equal(idx1, idx2) and torch.allclose(lp1, lp2, atol=1e-5)


def test_sampled_log_probs_equal_teacher_forced_scoring():
    """The log-probs recorded while sampling are those of the same (temperature, top-k) distribution
    recomputed by teacher forcing: what an RL ratio needs at step 0."""
    prior = make_prior()
    ctx = prior.context(obs(), torch.tensor([0, 1, 1]))
    idx, lp = prior.sample(ctx, temperature=0.7, top_k=4, generator=torch.Generator().manual_seed(3))
    logits = prior.logits(ctx, prior.tokens_in(idx))
    rescored = processed_log_probs(logits, 0.7, 4).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(lp, rescored, atol=1e-5)
    assert torch.isfinite(lp).all()


def test_gumbel_sampling_follows_the_scored_distribution():
    """Token frequencies over many draws match the processed softmax the log-probs come from."""
    prior = make_prior()
    n = 4000
    ctx = prior.context(obs(1), torch.tensor([1])).expand(n, -1, -1)
    idx, _ = prior.sample(ctx, temperature=1.5, top_k=6, generator=torch.Generator().manual_seed(0))
    first = processed_log_probs(prior.logits(ctx[:1], prior.tokens_in(idx[:1]))[:, 0], 1.5, 6).exp()[0]
    freq = torch.bincount(idx[:, 0], minlength=prior.vocab_size).float() / n
    assert float((freq - first).abs().max()) < 0.04
    assert int((freq > 0).sum()) <= 6


def test_top_k_keeps_k_tokens():
    lp = processed_log_probs(torch.randn(2, 50), 1.0, 5)
    assert ((lp > float("-inf")).sum(-1) == 5).all()
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2))


def test_prior_loss_and_actions_shapes():
    prior = make_prior().train()
    out = prior.loss(obs(), torch.tensor([0, 1, 0]), torch.rand(3, 16, 4))
    out["loss"].backward()
    assert prior.autoencoder.out.weight.grad is None  # stage-0 weights stay frozen
    assert prior.predict_actions(obs(2), torch.tensor([1, 0]), top_k=3).shape == (2, 16, 4)
    with pytest.raises(RiptError, match="task 'c'"):
        prior.task_index("c")


def test_training_mode_never_reaches_the_frozen_autoencoder():
    # its encoder makes the target tokens: with dropout on they would change from call to call
    torch.manual_seed(0)
    prior = SkillPrior(autoencoder={**AE, "dropout": 0.5}, task_names=["a"], image_keys=[], lowdim_dims={"state": 3},
                       lang_dim=8, dim=32, n_layer=1, n_head=2, dropout=0.5)
    actions = torch.rand(8, 16, 4)

    def assert_targets_fixed():
        assert prior.gpt.training and not any(m.training for m in prior.autoencoder.modules())
        first = prior.loss({"state": torch.randn(8, 1, 3)}, torch.zeros(8, dtype=torch.long), actions)["targets"]
        again = prior.loss({"state": torch.randn(8, 1, 3)}, torch.zeros(8, dtype=torch.long), actions)["targets"]
        assert torch.equal(first, again)

    assert_targets_fixed()  # fresh
    prior.eval().train()  # as after a validation pass
    assert_targets_fixed()


def test_fewer_encoder_stages_leave_a_finer_keypoint_map():
    img = torch.randint(0, 255, (2, 128, 128, 3), dtype=torch.uint8)
    for stages, side in [(4, 4), (2, 16)]:
        enc = ResNetEncoder(16, width=8, num_kp=8, stages=stages)
        assert enc.layers(enc.stem(img.permute(0, 3, 1, 2).float())).shape[-2:] == (side, side)
        assert enc(img).shape == (2, 16)
    prior = make_prior(encoder_stages=2).train()
    prior.loss(obs(), torch.tensor([0, 1, 0]), torch.rand(3, 16, 4))["loss"].backward()
    assert prior.image_encoders["cam_rgb"].layers[-1].conv2.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="stages must be 1-4"):
        ResNetEncoder(16, stages=5)


def test_an_encoder_whose_map_comes_down_to_one_cell_is_refused_in_one_line():
    """Four stages leave a 32 px image a single cell, on which the keypoints cannot move: the encoder's output would
    be the same for every image. Two stages leave 4x4, and different images give different features."""
    torch.manual_seed(0)
    images = torch.randint(0, 255, (2, 32, 32, 3), dtype=torch.uint8)
    with pytest.raises(RiptError, match=r"32x32 images leave a 1x1 feature map after 4 ResNet stages") as e:
        ResNetEncoder(16, width=8, num_kp=8, stages=4)(images)
    assert "\n" not in str(e.value)
    out = ResNetEncoder(16, width=8, num_kp=8, stages=2)(images)
    assert not torch.allclose(out[0], out[1])


def test_random_shift_keeps_shape_and_content_range():
    img = torch.randint(0, 255, (4, 16, 16, 3), dtype=torch.uint8)
    out = random_shift(img, 2, torch.Generator().manual_seed(0))
    assert out.shape == img.shape and out.dtype == torch.uint8
    assert not torch.equal(out, img)
    assert torch.equal(random_shift(img, 0, None), img)


def test_color_jitter_changes_colours_keeps_grays_gray_and_draws_per_sample():
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    img = torch.randint(0, 255, (6, 8, 8, 3), dtype=torch.uint8)
    out = color_jitter(img, 0.3, gen())
    assert out.shape == img.shape and out.dtype == torch.uint8 and not torch.equal(out, img)
    assert torch.equal(color_jitter(img, 0.0, gen()), img)  # off: the images, and no draw from the generator
    # a rank's block of a global batch is jittered as the same samples of the whole batch
    assert torch.equal(color_jitter(img[2:4], 0.3, gen(), slice(2, 4), 6), out[2:4])
    # hue and saturation act on chroma only: a gray image stays gray (brightness and contrast may change it)
    gray = torch.full((6, 8, 8, 3), 100, dtype=torch.uint8)
    gray[:, :4] = 180
    jittered = color_jitter(gray, 0.3, gen()).int()
    assert (jittered.max(-1).values - jittered.min(-1).values).max() <= 1
    assert len({int(v) for v in jittered[:, 0, 0, 0]}) > 1  # each sample its own factors


def test_compiled_loss_falls_back_to_eager_when_compiling_fails(monkeypatch):
    """A toolchain that cannot compile (no Triton, an unsupported op) costs one warning, not the run."""
    from omegaconf import OmegaConf

    from ript.utils import training

    def broken_compile(fn, mode=None):
        def run(*args, **kwargs):
            raise RuntimeError("backend compiler failed: no working C++ compiler")
        return run

    monkeypatch.setattr(training.torch, "compile", broken_compile)
    import logging

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("ript").addHandler(handler)  # the console setup of other tests stops propagation
    try:
        loss = training.CompiledLoss(lambda x: (2 * x).sum(), OmegaConf.create({"compile": True, "cuda_graphs": True}),
                                     "cpu")
        assert float(loss(torch.ones(3))) == 6.0
        assert float(loss(torch.ones(2))) == 4.0
    finally:
        logging.getLogger("ript").removeHandler(handler)
    assert loss.compiled is None
    assert len([w for w in warnings if "torch.compile failed" in w]) == 1
    off = training.CompiledLoss(lambda x: x, OmegaConf.create({"compile": "auto", "cuda_graphs": True}), "cpu")
    assert off.compiled is None  # auto: eager on a CPU


def test_deterministic_switch_sets_the_process_math_flags():
    """``train.deterministic`` turns on deterministic kernels and turns off cuDNN autotuning even when asked for;
    the default leaves both as PyTorch has them. (Set on a CPU machine too: they are process-wide flags.)"""
    from omegaconf import OmegaConf

    from ript.utils import training

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32)
    cfg = {"tf32": True, "cudnn_benchmark": True}
    try:
        training.fast_math("cuda", OmegaConf.create({**cfg, "deterministic": True}))
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        training.fast_math("cuda", OmegaConf.create({**cfg, "deterministic": False}))
        assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic
        assert torch.backends.cudnn.benchmark
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], before[2]
        torch.backends.cuda.matmul.allow_tf32 = before[3]


def test_deterministic_runs_step_eagerly_and_refuse_a_forced_compile():
    """Two compiled stage-1 runs on an H100 differed in the last bits, so
    ``train.deterministic`` turns ``compile=auto`` into the eager step, and refuses ``compile=true``."""
    from omegaconf import OmegaConf

    from ript.config import compose
    from ript.utils import training

    def compiled_on_cuda(**cfg):  # torch.compile only wraps here; nothing runs on a GPU
        return training.CompiledLoss(lambda x: x, OmegaConf.create({"cuda_graphs": False, **cfg}), "cuda").compiled

    assert compiled_on_cuda(compile="auto", deterministic=False) is not None
    assert compiled_on_cuda(compile="auto", deterministic=True) is None
    with pytest.raises(RiptError, match="train.deterministic=True .*train.compile=auto"):
        compose("stage1", ["train.deterministic=true", "train.compile=true"])
