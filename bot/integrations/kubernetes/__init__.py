"""Kubernetes behind the ``Cluster`` port, on the official ``kubernetes.aio`` client.

The only package of pitcrew that imports ``kubernetes`` (an import-linter contract holds it).
"""

from bot.integrations.kubernetes.cluster import KubernetesCluster

__all__ = ["KubernetesCluster"]
