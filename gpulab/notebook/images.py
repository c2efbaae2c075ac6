"""The images on a simulated node: what ``crictl rmi`` on that node does, for a lesson that needs a cold start."""

from __future__ import annotations

from .lesson import current

__all__ = ["remove_image"]


def remove_image(node: str, image: str) -> bool:
    """Take ``image`` off ``node``, as ``crictl rmi IMAGE`` run on the node would: the next pod there that needs it
    pulls it again (a cold start). Prints what happened; False when the node did not have it.

    Only the embedded backend's nodes keep their images where gpulab can reach them
    (:mod:`gpulab.runtime.imagemanager`); a kind node's images are in its own containerd.
    """
    from ..runtime.imagemanager import NodeImages, store_path

    nodes_dir = current().cluster.root / "nodes"
    if not (nodes_dir / node).is_dir():
        raise RuntimeError(f"{node} 不是本机模拟的节点（只有内嵌集群的节点把镜像记在 {nodes_dir} 下）；"
                           f"kind 节点上要在节点容器里执行 crictl rmi {image}")
    removed = NodeImages(store_path(nodes_dir, node)).remove(image)
    print(f"{node}: Deleted: {image}" if removed else f"{node} 上本来就没有 {image}")
    return removed
