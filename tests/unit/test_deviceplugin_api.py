"""The proto matches the kubelet's v1beta1 API and the committed stubs match the proto."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.fakegpu.deviceplugin import api_pb2, api_pb2_grpc, generate


def test_committed_stubs_match_the_proto(tmp_path: Path) -> None:
    # grpcio-tools is a dev dependency: `make install` brings it.
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(generate.STUB_FILES)
    for path in written:
        committed = generate.PACKAGE_DIR / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed.name} drifted from api.proto; run: python -m gpulab.fakegpu.deviceplugin.generate"
        )


def test_grpc_stub_imports_messages_relatively() -> None:
    text = (generate.PACKAGE_DIR / "api_pb2_grpc.py").read_text()
    assert "from . import api_pb2 as " in text


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("DevicePluginOptions", {"pre_start_required": 1, "get_preferred_allocation_available": 2}),
        ("RegisterRequest", {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        ("Device", {"ID": 1, "health": 2, "topology": 3}),
        ("NUMANode", {"ID": 1}),
        ("ContainerPreferredAllocationRequest",
         {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}),
        ("ContainerPreferredAllocationResponse", {"deviceIDs": 1}),
        ("ContainerAllocateRequest", {"devices_ids": 1}),
        ("PreStartContainerRequest", {"devices_ids": 1}),
        ("ContainerAllocateResponse", {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}),
        ("Mount", {"container_path": 1, "host_path": 2, "read_only": 3}),
        ("DeviceSpec", {"container_path": 1, "host_path": 2, "permissions": 3}),
        ("CDIDevice", {"name": 1}),
    ],
)
def test_field_names_and_tags(message: str, fields: dict[str, int]) -> None:
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert {f.name: f.number for f in descriptor.fields} == fields
    assert descriptor.full_name == f"v1beta1.{message}"


def test_services_and_methods() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert [m.name for m in services["Registration"].methods] == ["Register"]
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer",
    ]
    assert services["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    assert hasattr(api_pb2_grpc, "add_RegistrationServicer_to_server")
