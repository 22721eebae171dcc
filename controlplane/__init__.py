"""The control plane: public gRPC API, sessions, tool execution, sandboxes."""

from sandbox_agent.grpc_poller import prefer_poller

prefer_poller()
