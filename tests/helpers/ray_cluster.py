"""A two-node Ray cluster of this host (``ray.cluster_utils.Cluster``), for the tests that place work on nodes."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def two_node_cluster(cpus_per_node: int) -> Iterator[str]:
    """A head and a second node with ``cpus_per_node`` CPUs each; its address, for ``workers.ray_address``."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node})
    try:
        cluster.add_node(num_cpus=cpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def kill_actor(actor, timeout_s: float = 60.0) -> None:
    """Kills a Ray actor and returns once calls to it fail: ``ray.kill`` only asks for the kill, and on a loaded
    host the actor can answer a few more calls first."""
    import time

    import ray

    ray.kill(actor, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the Ray actor was still answering {timeout_s:g} s after ray.kill")
