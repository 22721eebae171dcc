"""Spans and instruments the domain code records, on the OpenTelemetry API only (never the SDK).

Without a configured SDK the API's no-op implementations make every helper here nearly free;
attribute work that costs anything is skipped unless the span is recording.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from controlplane.telemetry import attributes as a

T = TypeVar("T")
ABORTED = "Tool execution aborted"

tracer = trace.get_tracer(a.TRACER_NAME)
meter = metrics.get_meter(a.METER_NAME)

tool_duration = meter.create_histogram(
    a.METRIC_TOOL_DURATION, unit="s", description="Duration of tool executions, by tool and outcome",
)
init_duration = meter.create_histogram(
    a.METRIC_INIT_DURATION, unit="s", description="Duration of tool initialisation, by tool and source",
)
pool_hits = meter.create_counter(a.METRIC_POOL_HITS, description="Sandbox acquisitions served by the warm pool")
pool_misses = meter.create_counter(a.METRIC_POOL_MISSES, description="Sandbox acquisitions the pool could not serve")


class _SummedGauge:
    """An observable gauge summing a value read from every live owner (owners are held weakly)."""

    def __init__(self, name: str, description: str) -> None:
        self._owners: weakref.WeakKeyDictionary[Any, Callable[[Any], float]] = weakref.WeakKeyDictionary()
        meter.create_observable_gauge(name, callbacks=[self._observe], description=description)

    def watch(self, owner: T, read: Callable[[T], float]) -> None:
        self._owners[owner] = read

    def _observe(self, _: CallbackOptions) -> list[Observation]:
        return [Observation(sum(read(owner) for owner, read in list(self._owners.items())))]


pool_depth = _SummedGauge(a.METRIC_POOL_DEPTH, "Ready sandboxes waiting in the warm pool")
active_sessions = _SummedGauge(a.METRIC_ACTIVE_SESSIONS, "Sessions that are ready")


def fail(span: Span, error: BaseException, description: str = "") -> None:
    """ERROR status with a description, and the exception as an event (a cancellation as `cancelled`)."""
    if not span.is_recording():
        return
    if isinstance(error, asyncio.CancelledError):
        span.add_event("cancelled")
        span.set_status(Status(StatusCode.ERROR, description or "cancelled"))
        return
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, description or f"{type(error).__name__}: {error}"))


@contextmanager
def span(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Span]:
    """A current span that ends ERROR (with the exception recorded) when its block raises."""
    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            fail(current, exc)
            raise


def set_attributes(current: Span, attributes: Mapping[str, AttributeValue]) -> None:
    if current.is_recording():
        current.set_attributes(attributes)


def acquired(current: Span, sandbox_id: str, from_pool: bool) -> None:
    set_attributes(current, {a.SANDBOX_ID: sandbox_id, a.POOL_HIT: from_pool})


async def traced(name: str, attributes: Mapping[str, AttributeValue], work: Awaitable[T]) -> T:
    """Awaits `work` inside a span (tasks it creates are children of the span)."""
    with span(name, attributes):
        return await work


# -- tool calls ----------------------------------------------------------------------------------


class CallTrace:
    """The `execute_tool` span of one call; the executor tells it how the call ended."""

    __slots__ = ("_started", "error", "outcome", "span", "tenant", "tool")

    def __init__(self, current: Span, tool: str, tenant: str = "") -> None:
        self.span = current
        self.tool = tool
        self.tenant = tenant
        self.outcome = a.OUTCOME_ERROR
        self.error: BaseException | None = None
        self._started = time.perf_counter()

    def completed(self, output: str, truncated: bool, *, aborted: bool = False) -> None:
        """A result; an aborted call that still reported what it did (bash does) counts as cancelled."""
        if aborted:
            self.failed(a.OUTCOME_CANCELLED, asyncio.CancelledError(ABORTED))
        if self.span.is_recording():
            self.span.set_attributes({
                a.OUTPUT_BYTES: len(output.encode("utf-8", "surrogatepass")), a.TRUNCATED: truncated,
            })

    def failed(self, outcome: str, error: BaseException) -> None:
        self.outcome = a.OUTCOME_TIMEOUT if outcome == a.OUTCOME_ERROR and _timed_out(error) else outcome
        self.error = error

    def _finish(self) -> None:
        tool_duration.record(time.perf_counter() - self._started, {
            a.GEN_AI_TOOL_NAME: self.tool, a.OUTCOME: self.outcome, a.TENANT: self.tenant,
        })
        if not self.span.is_recording():
            return
        self.span.set_attribute(a.OUTCOME, self.outcome)
        if self.outcome != a.OUTCOME_OK:
            error = self.error or RuntimeError(self.outcome)
            if self.outcome == a.OUTCOME_CANCELLED and not isinstance(error, asyncio.CancelledError):
                self.span.add_event("cancelled")
            fail(self.span, error, str(error) or self.outcome)


@contextmanager
def execute_tool(
    tool: str, call_id: str, session_id: str, tenant: str, sandbox_id: str, source: str, origin: str,
) -> Iterator[CallTrace]:
    """The span of one tool execution (GenAI conventions plus `sandbox.*`), and its duration metric."""
    with tracer.start_as_current_span(
        f"{a.SPAN_EXECUTE_TOOL} {tool}", record_exception=False, set_status_on_exception=False,
        attributes={
            a.GEN_AI_OPERATION_NAME: a.OP_EXECUTE_TOOL, a.GEN_AI_TOOL_NAME: tool, a.GEN_AI_TOOL_CALL_ID: call_id,
            a.SESSION_ID: session_id, a.TENANT: tenant, a.SANDBOX_ID: sandbox_id, a.TOOL_SOURCE: source,
            a.TOOL_ORIGIN: origin,
        },
    ) as current:
        call = CallTrace(current, tool, tenant)
        try:
            yield call
            if call.error is None:
                call.outcome = a.OUTCOME_OK
        except BaseException as exc:
            call.failed(a.OUTCOME_CANCELLED if isinstance(exc, asyncio.CancelledError) else a.OUTCOME_ERROR, exc)
            raise
        finally:
            call._finish()


@contextmanager
def init_tool(tool: str, source: str, origin: str, measured_s: float | None = None) -> Iterator[Span]:
    """The span of one tool's init, and the init-duration metric (`measured_s` when timed elsewhere)."""
    started = time.perf_counter()
    with span(f"{a.SPAN_INIT_TOOL} {tool}", {
        a.GEN_AI_TOOL_NAME: tool, a.TOOL_SOURCE: source, a.TOOL_ORIGIN: origin,
    }) as current:
        yield current
    elapsed = measured_s if measured_s is not None else time.perf_counter() - started
    init_duration.record(elapsed, {a.GEN_AI_TOOL_NAME: tool, a.TOOL_SOURCE: source})


@contextmanager
def call_init(tool: str, source: str, origin: str, *, loaded_elsewhere: bool) -> Iterator[None]:
    """A call's init of its tool: an `init_tool` span, unless the tool was loaded (and its init traced)
    in the sandbox's tool host, where nothing is left to initialise at call time."""
    if loaded_elsewhere:
        yield
        return
    with init_tool(tool, source, origin):
        yield


@contextmanager
def listed_init(tool: str, source: str, origin: str, measured_ms: float | None) -> Iterator[None]:
    """A listing's init of one tool: an `init_tool` span, unless the tool was initialised (and its span
    made) where it was loaded, a sandbox's tool host, which measured `measured_ms`."""
    if measured_ms is not None:
        init_duration.record(measured_ms / 1000, {a.GEN_AI_TOOL_NAME: tool, a.TOOL_SOURCE: source})
        yield
        return
    with init_tool(tool, source, origin):
        yield


def _timed_out(error: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, TimeoutError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class McpListing:
    __slots__ = ("span",)

    def __init__(self, current: Span) -> None:
        self.span = current

    def finished(self, error: str, tools: int) -> None:
        if not self.span.is_recording():
            return
        self.span.set_attribute(a.MCP_TOOL_COUNT, tools)
        if error:
            self.span.set_status(Status(StatusCode.ERROR, error))


@contextmanager
def mcp_listing(server: str) -> Iterator[McpListing]:
    """The `init_tool mcp:{server}` span: connecting one MCP server and listing its tools."""
    with span(f"{a.SPAN_INIT_TOOL} mcp:{server}", {a.TOOL_SOURCE: "MCP", a.MCP_SERVER: server}) as current:
        yield McpListing(current)


# -- permissions ---------------------------------------------------------------------------------


def permission_ruled(permission: str, patterns: Sequence[str], decision: str, rule: str) -> None:
    """An ask the rules decided at once (auto-allow or deny): an event on the current span, not a wait
    span, because nothing waited and most calls ask (a span per ask would double a call's tracing cost)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.add_event(a.EVENT_PERMISSION, {
            a.PERMISSION: permission, a.PERMISSION_PATTERNS: list(patterns), a.PERMISSION_DECISION: decision,
            a.PERMISSION_RULE: rule,
        })


def permission_decided(decision: str, rule: str) -> None:
    """Names the decision on the current `await_permission` span."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes({a.PERMISSION_DECISION: decision, a.PERMISSION_RULE: rule})


@contextmanager
def permission_wait(permission: str, patterns: Sequence[str], session_id: str, call_id: str) -> Iterator[Span]:
    with span(f"{a.SPAN_PERMISSION} {permission}", {
        a.PERMISSION: permission, a.PERMISSION_PATTERNS: list(patterns), a.SESSION_ID: session_id,
        a.GEN_AI_TOOL_CALL_ID: call_id,
    }) as current:
        yield current


def current() -> Span:
    """The span current here (a non-recording one when none is)."""
    return trace.get_current_span()


def tool_logged(current_span: Span, origin: str, level: str, text: str, at: float) -> None:
    """A line a tool printed, as an event of its span (`log`, with its level, file and text)."""
    current_span.add_event(a.EVENT_TOOL_LOG, {a.LOG_LEVEL: level, a.LOG_ORIGIN: origin, a.LOG_TEXT: text},
                           timestamp=int(at * 1e9))
