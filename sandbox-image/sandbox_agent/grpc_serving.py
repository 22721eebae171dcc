"""The agent's gRPC server, for the agents that must serve gRPC (those behind the Swarm relay, which carries gRPC
over mutual TLS; AGENT_GRPC=1). The only agent module that imports grpc: an agent that serves frames only never
loads it (rpc_status.py says why).

The handlers are the frames' own (their context is a CallContext); this adapter gives them the gRPC call's metadata,
turns their `abort` into grpc's, and a request stream that breaks off into RequestsLostError.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, NoReturn

import grpc

from sandbox_agent.rpc_methods import METHODS, SERVICE, Method, Shape
from sandbox_agent.rpc_status import Code, RequestsLostError

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


class GrpcContext:
    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self._context = context

    def invocation_metadata(self) -> Sequence[tuple[str, Any]]:
        return tuple(self._context.invocation_metadata() or ())

    async def abort(self, code: Code, details: str) -> NoReturn:
        await self._context.abort(getattr(grpc.StatusCode, code.name), details)
        raise AssertionError("grpc's abort raises")  # pragma: no cover


async def _requests(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    try:
        async for request in requests:
            yield request
    except grpc.RpcError as exc:
        raise RequestsLostError(f"the caller's requests broke off: {exc}") from exc


def _handler(method: Method, serve: Callable[[Any, Any], Any]) -> grpc.RpcMethodHandler[Any, Any]:
    def arg(request: Any) -> Any:
        return _requests(request) if method.shape.streams_requests else request

    if method.shape.streams_responses:
        async def streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            async for response in serve(arg(request), GrpcContext(context)):
                yield response
        behaviour: Any = streaming
    else:
        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            return await serve(arg(request), GrpcContext(context))
        behaviour = unary
    make = {
        Shape.UNARY: grpc.unary_unary_rpc_method_handler, Shape.SERVER_STREAM: grpc.unary_stream_rpc_method_handler,
        Shape.CLIENT_STREAM: grpc.stream_unary_rpc_method_handler, Shape.BIDI: grpc.stream_stream_rpc_method_handler,
    }[method.shape]
    handler: grpc.RpcMethodHandler[Any, Any] = make(behaviour, request_deserializer=method.request.FromString,
                                          response_serializer=method.response.SerializeToString)
    return handler


def server(service: object, socket_path: str) -> grpc.aio.Server:
    """A gRPC server of `service`'s methods on the Unix socket `socket_path` (not started)."""
    served = grpc.aio.server(options=SERVER_OPTIONS)
    handlers = {name: _handler(m, getattr(service, name)) for name, m in METHODS.items()}
    served.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    served.add_insecure_port(f"unix:{socket_path}")
    return served
