// Runs tool calls and plugin hooks: validation with the tool's own zod schema, the ToolContext
// (metadata, ask, abort) and the normalisation of whatever execute returned.
import { log, send } from "./channel.ts"
import { CallBudget, logScope } from "./console_capture.ts"
import { type HostTool, messageOf, type Registry, withTimeout } from "./loader.ts"
import { type Recording, UNTRACED } from "./tracing.ts"
import { killAll, recordingChildren } from "./children.ts"

export const HOOK_LIMIT_MS = Number(process.env.OCSB_TOOLHOST_HOOK_LIMIT_MS ?? "10000")
/** How long an aborted call may run on before the children it started are killed (the driver's grace). */
export const ABORT_GRACE_MS = 500

type Json = Record<string, unknown>
type CallContext = {
  sessionID?: string
  messageID?: string
  agent?: string
  callID?: string
  directory?: string
  worktree?: string
  extra?: Json
}
type Pending = { callId: string; resolve: () => void; reject: (error: Error) => void }

export type Normalised = { title: string; output: string; metadata: Json; attachments: Json[] }

function isPlainObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value)
}

function stringify(value: unknown): string {
  if (value === undefined) return ""
  try {
    const text = JSON.stringify(value)
    if (typeof text === "string") return text
  } catch {
    // circular data or a BigInt: fall through to String()
  }
  return String(value)
}

export function normalise(result: unknown): Normalised {
  if (typeof result === "string") return { title: "", output: result, metadata: {}, attachments: [] }
  if (isPlainObject(result) && typeof result.output === "string") {
    const attachments = Array.isArray(result.attachments) ? result.attachments.filter(isPlainObject) : []
    return {
      title: typeof result.title === "string" ? result.title : "",
      output: result.output,
      metadata: isPlainObject(result.metadata) ? result.metadata : {},
      attachments: attachments.map((item) => {
        const attachment: Json = { mime: String(item.mime ?? ""), url: String(item.url ?? "") }
        if (typeof item.filename === "string") attachment.filename = item.filename
        return attachment
      }),
    }
  }
  return { title: "", output: stringify(result), metadata: {}, attachments: [] }
}

/** The parsed arguments, with the keys the schema does not declare put back as they came. */
function withUndeclared(tool: HostTool, raw: Json, parsed: Json): Json {
  const args: Json = { ...parsed }
  for (const [key, value] of Object.entries(raw)) {
    if (!tool.declared.has(key) && !(key in args)) args[key] = value
  }
  return args
}

export class Calls {
  private running = new Map<string, { controller: AbortController; children: Set<number> }>()
  private asks = new Map<string, Pending>()
  private askCount = 0

  constructor(private readonly registry: Registry) {}

  async call(id: string, toolId: string, raw: unknown, context: CallContext,
             recording: Recording = UNTRACED): Promise<void> {
    const span = recording.start(`toolhost.execute ${toolId}`, {
      "gen_ai.tool.name": toolId, "gen_ai.tool.call.id": context.callID ?? "",
    })
    // Every reply of the call ends its span first, so that the span travels with it.
    const reply = (message: Record<string, unknown>) => {
      if (message.type === "error") span?.fail(String(message.message))
      span?.end()
      send({ ...message, ...recording.field() })
    }
    const tool = this.registry.tools.get(toolId)
    if (tool === undefined) {
      reply({ id, type: "error", message: `Unknown tool: ${toolId}` })
      return
    }
    span?.set("sandbox.tool.origin", tool.origin).set("sandbox.tool.source", tool.source === "CUSTOM" ? "custom" : "plugin")
    const parsed = tool.schema.safeParse(raw)
    if (!parsed.success) {
      const message = `The ${toolId} tool was called with invalid arguments: ${parsed.error}.\n` +
        "Please rewrite the input so it satisfies the expected schema."
      reply({ id, type: "error", message })
      return
    }
    const controller = new AbortController()
    const children = new Set<number>()
    this.running.set(id, { controller, children })
    const ctx = {
      sessionID: context.sessionID ?? "", messageID: context.messageID ?? "", agent: context.agent ?? "",
      callID: context.callID ?? "", directory: context.directory ?? process.cwd(),
      worktree: context.worktree ?? process.cwd(), extra: context.extra ?? {}, abort: controller.signal,
      // Upstream's context carries the session's messages; the platform runs no model and keeps no
      // history, so a tool that reads them finds an empty list instead of failing on `undefined`.
      messages: [],
      metadata: (input: { title?: string; metadata?: Json } = {}) => {
        const update: Json = { id, type: "metadata" }
        if (input.title !== undefined) update.title = input.title
        if (input.metadata !== undefined) update.metadata = input.metadata
        send(update)
      },
      ask: (request: { permission: string; patterns?: string[]; always?: string[]; metadata?: Json }) =>
        this.ask(id, request),
    }
    // The call's console lines go out tagged with its request, before its reply, within its budget.
    const budget = new CallBudget()
    try {
      const args = withUndeclared(tool, raw as Json, parsed.data as Json)
      const result = await logScope.run({ request: id, origin: tool.origin, budget },
                                        () => recordingChildren(children, () => tool.execute(args, ctx)))
      budget.close(id, tool.origin)
      const normalised = normalise(result)
      try {
        JSON.stringify(normalised) // fails before the span is ended, so the error reply still carries it
        reply({ id, type: "result", ...normalised })
      } catch (error) {
        reply({ id, type: "error", message: `The ${toolId} tool returned a result that is not JSON: ${messageOf(error)}` })
      }
    } catch (error) {
      budget.close(id, tool.origin)
      reply({ id, type: "error", message: messageOf(error) })
    } finally {
      this.running.delete(id)
    }
  }

  private ask(callId: string, request: { permission: string; patterns?: string[]; always?: string[]; metadata?: Json }):
    Promise<void> {
    const askId = `${callId}.${++this.askCount}`
    return new Promise<void>((resolve, reject) => {
      this.asks.set(askId, { callId, resolve, reject })
      send({
        id: callId, type: "ask", ask_id: askId, permission: request.permission, patterns: request.patterns ?? [],
        always: request.always ?? [], metadata: request.metadata ?? {},
      })
    })
  }

  answer(askId: string, allowed: boolean, message: string): void {
    const pending = this.asks.get(askId)
    if (pending === undefined) return log(`ask_reply for unknown ask ${askId}`)
    this.asks.delete(askId)
    if (allowed) pending.resolve()
    else pending.reject(new Error(message))
  }

  abort(callId: string, reason: string): void {
    const running = this.running.get(callId)
    running?.controller.abort(reason)
    if (running !== undefined) {
      // A call still running after the grace is abandoned by the driver: what it started must end now.
      setTimeout(() => {
        if (this.running.get(callId) === running) killAll(running.children)
      }, ABORT_GRACE_MS)
    }
    // Nobody will answer the call's open questions any more; a tool waiting on one can now end.
    for (const [askId, pending] of this.asks) {
      if (pending.callId !== callId) continue
      this.asks.delete(askId)
      pending.reject(new Error("Tool execution aborted"))
    }
  }

  async hook(id: string, name: string, input: Json, output: Json): Promise<void> {
    for (const plugin of this.registry.plugins) {
      const hook = plugin.hooks[name]
      if (typeof hook !== "function") continue
      let thrown = false
      const scope = { request: id, origin: plugin.origin }
      const calling = () => Promise.resolve().then(() => hook.call(plugin.hooks, input, output))
      const running = logScope.run(scope, calling).catch((error) => {
        thrown = true
        throw error
      })
      try {
        await withTimeout(running, HOOK_LIMIT_MS, "the hook")
      } catch (error) {
        // The hook's own exception fails the call unchanged, as upstream lets it through; a time-out is described.
        const described = `Plugin hook ${name} failed (${plugin.origin}): ${messageOf(error)}`
        log(described)
        send({ id, type: "error", message: thrown ? messageOf(error) : described })
        return
      }
    }
    send({ id, type: "hook_result", output })
  }
}
