"""The SandboxAgent service's methods (proto/sandbox/v1/agent.proto), for the two carriers that serve them: each
method's shape (which sides stream) and its request and response messages, so the framed socket and the gRPC
adapter agree without the generated gRPC stubs (which import grpc)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sandbox.v1 import agent_pb2 as pb


class Shape(enum.Enum):
    UNARY = "unary_unary"
    SERVER_STREAM = "unary_stream"
    CLIENT_STREAM = "stream_unary"
    BIDI = "stream_stream"

    @property
    def streams_requests(self) -> bool:
        return self in (Shape.CLIENT_STREAM, Shape.BIDI)

    @property
    def streams_responses(self) -> bool:
        return self in (Shape.SERVER_STREAM, Shape.BIDI)


@dataclass(frozen=True)
class Method:
    name: str
    shape: Shape
    request: type[Any]
    response: type[Any]


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("Health", Shape.UNARY, pb.HealthRequest, pb.HealthResponse),
    Method("ExecMany", Shape.BIDI, pb.ExecManyRequest, pb.ExecManyEvent),
    Method("UploadWorkspace", Shape.CLIENT_STREAM, pb.UploadWorkspaceRequest, pb.UploadWorkspaceResponse),
    Method("DownloadWorkspace", Shape.SERVER_STREAM, pb.DownloadWorkspaceRequest, pb.DownloadWorkspaceResponse),
    Method("RunTools", Shape.BIDI, pb.RunToolsRequest, pb.RunToolsEvent),
    Method("SaveToolOutput", Shape.UNARY, pb.SaveToolOutputRequest, pb.SaveToolOutputResponse),
    Method("ListCustomTools", Shape.UNARY, pb.ListCustomToolsRequest, pb.ListCustomToolsResponse),
    Method("SnapshotCustomCode", Shape.UNARY, pb.SnapshotCustomCodeRequest, pb.SnapshotCustomCodeResponse),
    Method("RunPluginHook", Shape.UNARY, pb.RunPluginHookRequest, pb.RunPluginHookResponse),
    Method("WriteFile", Shape.CLIENT_STREAM, pb.WriteFileRequest, pb.FileEntry),
    Method("ReadFile", Shape.SERVER_STREAM, pb.ReadFileRequest, pb.ReadFileResponse),
    Method("ListFiles", Shape.UNARY, pb.ListFilesRequest, pb.ListFilesResponse),
    Method("StartNetwork", Shape.UNARY, pb.StartNetworkRequest, pb.StartNetworkResponse),
)}
SERVICE = "sandbox.v1.SandboxAgent"
