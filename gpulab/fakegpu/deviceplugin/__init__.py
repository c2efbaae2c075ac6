"""The kubelet device-plugin API (v1beta1) over gRPC on unix sockets.

- ``plugin``   the fake NVIDIA device plugin: serves ``DevicePlugin`` on one
               socket per resource and registers with the kubelet.
- ``kubelet``  the kubelet's device-manager side for simulated nodes: serves
               ``Registration``, watches plugins, allocates devices to pods.
- ``eventloop`` the one asyncio loop (``grpc.aio``) that serves every plugin and
               kubelet socket of the process, and how blocking code uses it.
- ``api_pb2`` / ``api_pb2_grpc``  stubs generated from ``api.proto`` by
               ``generate.py`` (committed; run time needs grpcio + protobuf).

The constants below are those of ``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1``.
"""

VERSION = "v1beta1"
SUPPORTED_VERSIONS = (VERSION,)
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
DEVICE_PLUGIN_PATH = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET_NAME = "kubelet.sock"
KUBELET_SOCKET = DEVICE_PLUGIN_PATH + KUBELET_SOCKET_NAME

__all__ = [
    "DEVICE_PLUGIN_PATH",
    "HEALTHY",
    "KUBELET_SOCKET",
    "KUBELET_SOCKET_NAME",
    "SUPPORTED_VERSIONS",
    "UNHEALTHY",
    "VERSION",
]
