// What tool and plugin code writes with console.* becomes log lines an author can read: each is tagged with
// the file it comes from (and the call it ran in) and sent to the agent, which keeps and forwards them within
// its bounds. Lines are cut here too, so a tool printing in a loop costs the host little.
import { AsyncLocalStorage } from "node:async_hooks"
import { format } from "node:util"
import { send } from "./channel.ts"
import { unixMs } from "./tracing.ts"

export type LogLine = { origin: string; level: string; text: string; at: number }
export type LogScope = {
  request: string
  origin: string
  /** Where lines go instead of the channel (a file's load-time lines, sent with the load's reply). */
  sink?: LogSink
  /** A call's lines: counted against its budget. */
  budget?: CallBudget
}

export const MAX_LINE_CHARS = 8192
const MAX_SINK_LINES = 50
const MAX_SINK_CHARS = 16 * 1024
const MAX_CALL_CHARS = 64 * 1024

const LEVELS: Record<string, string> = {
  log: "info", info: "info", dir: "info", table: "info", debug: "debug", trace: "debug", warn: "warn", error: "error",
}
export const logScope = new AsyncLocalStorage<LogScope>()

/** The file being imported: a module's top-level code does not run in the importer's async context in Bun,
 * so its lines are tagged by this (loads run one at a time; a call's own lines keep their scope). */
let importing: LogScope | undefined

export async function whileImporting(scope: LogScope, run: () => Promise<unknown>): Promise<unknown> {
  importing = scope
  try {
    return await run()
  } finally {
    importing = undefined
  }
}

/** A file's load-time lines, bounded; what did not fit is counted and told with a last line. */
export class LogSink {
  lines: LogLine[] = []
  private chars = 0
  private dropped = 0

  add(line: LogLine): void {
    if (this.lines.length >= MAX_SINK_LINES || this.chars + line.text.length > MAX_SINK_CHARS) {
      this.dropped++
      return
    }
    this.chars += line.text.length
    this.lines.push(line)
  }

  all(origin: string): LogLine[] {
    if (this.dropped === 0) return this.lines
    return [...this.lines, { origin, level: "warn", text: `[${this.dropped} more log lines dropped]`, at: unixMs() }]
  }
}

/** A call's lines past its budget are dropped; `close` sends one line saying how many. */
export class CallBudget {
  private chars = 0
  dropped = 0

  take(size: number): boolean {
    if (this.chars + size > MAX_CALL_CHARS) {
      this.dropped++
      return false
    }
    this.chars += size
    return true
  }

  close(request: string, origin: string): void {
    if (this.dropped > 0) {
      const text = `[${this.dropped} more log lines dropped]`
      send({ id: request, type: "log", origin, level: "warn", text, at: unixMs() })
    }
  }
}

function cut(text: string): string {
  if (text.length <= MAX_LINE_CHARS) return text
  return `${text.slice(0, MAX_LINE_CHARS)}… [${text.length - MAX_LINE_CHARS} characters cut]`
}

function emit(level: string, args: unknown[]): void {
  let text: string
  try {
    text = cut(format(...args))
  } catch {
    text = "[a value console could not print]"
  }
  const scope = logScope.getStore() ?? importing
  const line = { origin: scope?.origin ?? "", level, text, at: unixMs() }
  if (scope?.sink !== undefined) return scope.sink.add(line)
  if (scope?.budget !== undefined && !scope.budget.take(text.length)) return
  try {
    send({ id: scope?.request ?? "", type: "log", ...line })
  } catch {
    // a line that cannot be sent is lost, never the call
  }
}

/** Replaces console's writers; `console.*` in tool code from now on goes to `emit`. */
export function captureConsole(): void {
  for (const [name, level] of Object.entries(LEVELS)) {
    ;(console as unknown as Record<string, unknown>)[name] = (...args: unknown[]) => emit(level, args)
  }
  ;(console as unknown as Record<string, unknown>).assert = (condition: unknown, ...args: unknown[]) => {
    if (!condition) emit("error", ["Assertion failed", ...args])
  }
}
