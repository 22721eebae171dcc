"""A real OTLP receiver on loopback for the tracing demo and tests: rotel (a Rust collector from PyPI)
with its debug log of received spans, parsed back into records."""

from __future__ import annotations

import importlib.util
import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

_FIELD = re.compile(r"^ {4}(Trace ID|Parent ID|ID|Name|Kind|Status code|Status message)\s*: ?(.*)$")
_TIME = re.compile(r"^(Start|End) time: (\d+)$")
_ATTRIBUTE = re.compile(r"^ {5}-> ([^:]+): (Str|Int|Bool|Double|Slice|Map|Bytes)\((.*)\)$")
_EVENT_NAME = re.compile(r"^ {5}-> Name: (.*)$")

AttributeValue = str | int | float | bool


@dataclass
class ExportedSpan:
    name: str = ""
    trace_id: str = ""
    span_id: str = ""
    parent_id: str = ""
    kind: str = ""
    start_ns: int = 0
    end_ns: int = 0
    status_code: str = ""
    status_message: str = ""
    service: str = ""
    attributes: dict[str, AttributeValue] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(kind: str, text: str) -> AttributeValue:
    if kind == "Int":
        return int(text)
    if kind == "Bool":
        return text == "true"
    if kind == "Double":
        return float(text)
    return text


def parse_debug_log(text: str) -> list[ExportedSpan]:
    """The spans in rotel's `--debug-log traces --debug-log-verbosity detailed` output.

    Multi-line attribute values (exception stack traces) are skipped, not parsed.
    """
    found: list[ExportedSpan] = []
    service = ""
    section = ""
    current: ExportedSpan | None = None
    for line in text.splitlines():
        if line.startswith("ResourceSpans #"):
            section, service, current = "resource", "", None
        elif line == "Resource attributes:":
            section = "resource"
        elif line.startswith("Span #"):
            current = ExportedSpan(service=service)
            found.append(current)
            section = "span"
        elif line == "Attributes:":
            section = "attributes"
        elif line == "Events:":
            section = "events"
        elif line.startswith(("Links:", "ScopeSpans #")):
            section = "other"
        elif section == "resource" and (match := _ATTRIBUTE.match(line)):
            if match[1] == "service.name":
                service = match[3]
        elif current is not None and (match := _FIELD.match(line)):
            name = {"Trace ID": "trace_id", "Parent ID": "parent_id", "ID": "span_id", "Name": "name",
                    "Kind": "kind", "Status code": "status_code", "Status message": "status_message"}[match[1]]
            setattr(current, name, match[2].strip() if name != "status_message" else match[2])
        elif current is not None and (match := _TIME.match(line)):
            setattr(current, "start_ns" if match[1] == "Start" else "end_ns", int(match[2]))
        elif current is not None and section == "attributes" and (match := _ATTRIBUTE.match(line)):
            current.attributes[match[1]] = _value(match[2], match[3])
        elif current is not None and section == "events" and (match := _EVENT_NAME.match(line)):
            current.events.append(match[1])
    return found


def rotel_binary() -> Path:
    spec = importlib.util.find_spec("rotel")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        binary = Path(location) / "rotel-agent"
        if binary.exists():
            return binary
    raise RuntimeError("rotel is not installed: `.venv/bin/pip install rotel==0.0.1a15` (PyPI; the dev extra pins it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rotel:
    """rotel-agent listening for OTLP on 127.0.0.1 only (gRPC and HTTP), discarding what it logs."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.grpc_port = free_port()
        self.http_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout_s: float = 30.0) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self._process = subprocess.Popen(
                [str(rotel_binary()), "start", "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
                 "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}", "--exporter", "blackhole",
                 "--debug-log", "traces", "--debug-log-verbosity", "detailed"],
                stdout=out, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while not (_listening(self.grpc_port) and _listening(self.http_port)):
            if self._process.poll() is not None:
                raise RuntimeError(f"rotel exited: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("rotel did not start listening")
            time.sleep(0.05)

    def spans(self) -> list[ExportedSpan]:
        return parse_debug_log(self.log_path.read_text(errors="replace"))

    def wait_for(self, name: str, timeout_s: float = 30.0) -> list[ExportedSpan]:
        """All spans received so far, once one named `name` has arrived."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans()
            if any(s.name == name for s in spans):
                return spans
            if time.monotonic() > deadline:
                raise TimeoutError(f"no span {name!r} reached rotel; got {sorted({s.name for s in spans})}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0
