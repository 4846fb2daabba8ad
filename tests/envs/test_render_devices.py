"""Where the simulators render, against where the policy computes."""

import torch

from ript.envs.gl import renders_apart


def test_simulators_render_apart_from_the_policy_only_on_other_gpus(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    gpu0 = torch.device("cuda", 0)
    assert renders_apart(gpu0, ["1", "1"])
    assert not renders_apart(gpu0, ["1", "0"])
    assert not renders_apart(gpu0, [None])  # EGL's default device
    assert not renders_apart(gpu0, None)  # not known (Ray actors)
    assert not renders_apart(torch.device("cpu"), ["1"])  # a CPU policy shares the cores instead
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert renders_apart(gpu0, [None])


def test_a_gpu_is_named_as_the_host_numbers_it_under_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a Ray actor given the host's second GPU sees it as cuda:0
    assert not renders_apart(torch.device("cuda", 0), ["1"])
    assert renders_apart(torch.device("cuda", 0), ["0"])
