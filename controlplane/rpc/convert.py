"""Proto <-> domain conversion for the public API."""

from __future__ import annotations

from google.protobuf.timestamp_pb2 import Timestamp

from controlplane.core.seam.messages import CommandSpec, ExecEvent, Exited, Output, Started
from controlplane.core.sessions.admission import CreateSpec
from controlplane.core.sessions.models import NetworkPolicy, Resources, Session, SessionState
from controlplane.core.sessions.templates import TemplateInfo
from controlplane.errors import InvalidArgumentError
from controlplane.v1 import sandbox_pb2, session_pb2

_STATE = {
    SessionState.CREATING: session_pb2.Session.CREATING,
    SessionState.READY: session_pb2.Session.READY,
    SessionState.FAILED: session_pb2.Session.FAILED,
    SessionState.DELETED: session_pb2.Session.DELETED,
    SessionState.PAUSED: session_pb2.Session.PAUSED,
}


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def session_to_proto(s: Session, expires_at: float) -> session_pb2.Session:
    return session_pb2.Session(
        id=s.id,
        tenant=s.tenant,
        agent=s.agent,
        state=_STATE[s.state],
        sandbox_id=s.sandbox_id,
        created_at=_ts(s.created_at),
        expires_at=_ts(s.deleted_at if s.deleted_at is not None else expires_at),
        labels=s.labels,
        resources=session_pb2.Resources(cpu=s.resources.cpu, memory_mb=s.resources.memory_mb, pids=s.resources.pids),
        status_message=s.status_message,
        last_active_at=_ts(s.last_active_at),
        parent_id=s.parent_id,
        title=s.title,
        template=s.template,
        network=_network_to_proto(s.network),
    )


def _network_to_proto(network: NetworkPolicy | None) -> session_pb2.NetworkPolicy | None:
    if network is None:
        return None
    return session_pb2.NetworkPolicy(allow_hosts=network.allow_hosts, allow_cidrs=network.allow_cidrs)


_TEMPLATE_STATE = {
    "building": session_pb2.Template.BUILDING, "ready": session_pb2.Template.READY,
    "failed": session_pb2.Template.FAILED,
}


def template_to_proto(t: TemplateInfo) -> session_pb2.Template:
    return session_pb2.Template(name=t.name, image=t.image, state=_TEMPLATE_STATE[t.state], error=t.error,
                                pool_size=t.pool_size)


def create_spec(request: session_pb2.CreateSessionRequest) -> CreateSpec:
    r = request.resources
    resources = Resources(r.cpu, r.memory_mb, r.pids) if request.HasField("resources") else None
    n = request.network
    # An empty policy asks for nothing: the same as none (no proxy, no forwarder, no variables).
    network = NetworkPolicy(tuple(n.allow_hosts), tuple(n.allow_cidrs)) if n.allow_hosts or n.allow_cidrs else None
    return CreateSpec(
        agent=request.agent,
        workspace_archive=request.workspace_archive,
        config_json=request.config_json,
        labels=dict(request.labels),
        resources=resources,
        template=request.template,
        network=network,
    )


def command_spec(start: sandbox_pb2.ExecStart, default_timeout_ms: int, max_timeout_ms: int) -> CommandSpec:
    if bool(start.argv) == bool(start.command):
        raise InvalidArgumentError("set exactly one of `argv` and `command`")
    if start.timeout_ms > max_timeout_ms:
        raise InvalidArgumentError(f"timeout_ms must be at most {max_timeout_ms}")
    if any("\0" in a for a in start.argv) or "\0" in start.command or "\0" in start.cwd:
        raise InvalidArgumentError("command, arguments and cwd must not contain NUL bytes")
    return CommandSpec(
        argv=list(start.argv),
        command=start.command,
        env=dict(start.env),
        cwd=start.cwd,
        timeout_ms=start.timeout_ms or default_timeout_ms,
        stdin=start.stdin,
        merge_stderr=start.merge_stderr,
    )


def exec_event(seq: int, event: ExecEvent) -> sandbox_pb2.ExecEvent:
    if isinstance(event, Output):
        if event.stream == "stdout":
            return sandbox_pb2.ExecEvent(seq=seq, stdout=event.data)
        return sandbox_pb2.ExecEvent(seq=seq, stderr=event.data)
    if isinstance(event, Started):
        return sandbox_pb2.ExecEvent(seq=seq, started_pid=event.pid)
    assert isinstance(event, Exited)
    return sandbox_pb2.ExecEvent(
        seq=seq,
        exited=sandbox_pb2.ExecExited(
            exit_code=event.exit_code, signal=event.signal, timed_out=event.timed_out,
            aborted=event.aborted, duration_ms=event.duration_ms,
        ),
    )
