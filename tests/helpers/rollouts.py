"""The one-env, every-frame oracle the runner's recorded decisions are checked against."""

from ript.envs.worker_env import EpisodeSpec


def step_by_step(policy, spec: EpisodeSpec, render: dict, max_steps: int) -> dict:
    """The oracle: one env in this process, every step rendered and observed (the runner renders only the
    frames a decision reads, in a worker, for several envs at once)."""
    from ript.envs.metaworld import MetaWorldTask, RenderSettings

    task = MetaWorldTask(spec.task_name, RenderSettings.from_dict(render), max_steps)
    try:
        policy.reset(1)
        policy.reset_env(0, spec.task_name, spec.key)
        policy.observe(0, task.reset(spec.seed, render=True))
        length, done, success, rewards = 0, False, False, []
        while not done:
            rewards.append(0.0)
            for action in policy.act_chunk([True])[0]:
                obs, reward, done, info = task.step(action, render=True)
                policy.observe(0, obs)
                length, success, rewards[-1] = length + 1, info["success"], rewards[-1] + reward
                if done:
                    break
        if not success:
            policy.bootstrap([0])  # a critic's value of the last observation (nothing without one)
        return {"task": spec.task_name, "seed": spec.seed, "success": success, "length": length,
                "decisions": policy.take_record(0), "chunk_rewards": rewards}
    finally:
        task.close()
