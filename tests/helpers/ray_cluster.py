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
