// Spans recorded in the Bun host for a traced request, returned in the reply's `spans` list (the
// sandbox has no network; the agent passes them on to the control plane, which exports them).
// A request without a `trace` field records nothing.

export type Trace = { trace_id: string; parent_id: string }
type Value = string | number | boolean
type SpanEvent = { name: string; time_ms: number; attributes: Record<string, Value> }
export type SpanJson = {
  trace_id: string
  span_id: string
  parent_id: string
  name: string
  start_ms: number
  end_ms: number
  attributes: Record<string, Value>
  status: "unset" | "ok" | "error"
  message: string
  events: SpanEvent[]
}

const HEX32 = /^[0-9a-f]{32}$/
const HEX16 = /^[0-9a-f]{16}$/

/** The trace a request asked for, or undefined when it carries none (or a malformed one). */
export function traceOf(request: Record<string, unknown>): Trace | undefined {
  const trace = request.trace as Record<string, unknown> | undefined
  if (typeof trace !== "object" || trace === null) return undefined
  const { trace_id, parent_id } = trace
  if (typeof trace_id !== "string" || typeof parent_id !== "string") return undefined
  return HEX32.test(trace_id) && HEX16.test(parent_id) ? { trace_id, parent_id } : undefined
}

/** Unix time in milliseconds with sub-millisecond precision, from a performance.now() reading. */
export function unixMs(performanceNow: number = performance.now()): number {
  return performance.timeOrigin + performanceNow
}

function spanId(): string {
  const bytes = new Uint8Array(8)
  do crypto.getRandomValues(bytes)
  while (bytes.every((b) => b === 0))
  return Buffer.from(bytes).toString("hex")
}

export class Span {
  readonly id = spanId()
  private readonly json: SpanJson
  private ended = false

  constructor(private readonly sink: SpanJson[], trace: Trace, name: string, attributes: Record<string, Value>,
              startMs: number, parentId: string = trace.parent_id) {
    this.json = {
      trace_id: trace.trace_id, span_id: this.id, parent_id: parentId, name, start_ms: startMs, end_ms: startMs,
      attributes: { ...attributes }, status: "unset", message: "", events: [],
    }
  }

  set(key: string, value: Value): this {
    this.json.attributes[key] = value
    return this
  }

  event(name: string, atMs: number = unixMs(), attributes: Record<string, Value> = {}): this {
    this.json.events.push({ name, time_ms: atMs, attributes })
    return this
  }

  fail(message: string): this {
    this.json.status = "error"
    this.json.message = message
    return this
  }

  end(atMs: number = unixMs()): void {
    if (this.ended) return
    this.ended = true
    this.json.end_ms = Math.max(atMs, this.json.start_ms)
    this.sink.push(this.json)
  }
}

/** Collects the spans of one request; every method is a no-op when the request is not traced. */
export class Recording {
  readonly spans: SpanJson[] = []

  constructor(readonly trace: Trace | undefined) {}

  start(name: string, attributes: Record<string, Value> = {}, startMs: number = unixMs(),
        parent?: Span): Span | undefined {
    if (this.trace === undefined) return undefined
    return new Span(this.spans, this.trace, name, attributes, startMs, parent?.id ?? this.trace.parent_id)
  }

  /** The `spans` field of a reply: absent when nothing was recorded. */
  field(): { spans?: SpanJson[] } {
    return this.spans.length > 0 ? { spans: this.spans } : {}
  }
}

export const UNTRACED = new Recording(undefined)
