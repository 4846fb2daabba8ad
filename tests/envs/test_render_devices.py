"""Where the simulators render, against where the policy computes."""

import torch

from ript.envs.gl import renders_apart, worker_render_gpus


def test_simulators_render_apart_from_the_policy_only_on_other_gpus(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    gpu0 = torch.device("cuda", 0)
    assert renders_apart(gpu0, [1, 1])
    assert not renders_apart(gpu0, [1, 0])
    assert not renders_apart(gpu0, [None])  # EGL's default device
    assert not renders_apart(gpu0, None)  # not known (Ray actors)
    assert not renders_apart(torch.device("cpu"), [1])  # a CPU policy shares the cores instead
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert renders_apart(gpu0, [None])


def test_a_gpu_is_named_as_the_host_numbers_it_under_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # a Ray actor given the host's second GPU sees it as cuda:0
    assert not renders_apart(torch.device("cuda", 0), [1])
    assert renders_apart(torch.device("cuda", 0), [0])


def test_workers_render_on_the_gpus_set_round_robin_unless_the_user_named_an_egl_device(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "egl")
    monkeypatch.delenv("MUJOCO_EGL_DEVICE_ID", raising=False)
    assert worker_render_gpus(3, [2, 5]) == [2, 5, 2]
    monkeypatch.setenv("MUJOCO_EGL_DEVICE_ID", "0")  # inherited by the workers: EGL's index, left to them
    assert worker_render_gpus(2, [2, 5]) == [None, None]
