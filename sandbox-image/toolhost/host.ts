// The Bun tool host: one long-lived process per session that imports the project's custom tool and
// plugin files once and serves calls, hooks and permission replies over the protocol channel.
// Run as `bun --no-install run /opt/agent/toolhost/host.ts` from its own directory; harden.ts moves to the project.
import "./harden.ts" // first: before any other code runs in the host
import { log, requestLines, send } from "./channel.ts"
import { Calls } from "./calls.ts"
import { captureConsole, logScope } from "./console_capture.ts"
import { type FileSpec, messageOf, Registry } from "./loader.ts"
import { Recording, traceOf } from "./tracing.ts"

type Request = Record<string, unknown> & { id?: string; type?: string }

captureConsole()
const registry = new Registry()
const calls = new Calls(registry)
const exit = process.exit.bind(process)

// A tool must not take the whole host (and every other call) down with it.
process.exit = ((code?: number) => {
  throw new Error(`process.exit(${code ?? ""}) is not allowed in a tool`)
}) as typeof process.exit
process.on("uncaughtException", (error) => log(`uncaught exception: ${messageOf(error)}`))
process.on("unhandledRejection", (error) => log(`unhandled rejection: ${messageOf(error)}`))

let loading: Promise<unknown> = Promise.resolve()
const inFlight = new Set<Promise<void>>()

async function load(request: Request): Promise<void> {
  await logScope.run({ request: String(request.id ?? ""), origin: "" }, () => loadInScope(request))
}

async function loadInScope(request: Request): Promise<void> {
  const recording = new Recording(traceOf(request))
  const result = await registry.load(request.files as FileSpec[], String(request.directory ?? process.cwd()),
                                     String(request.worktree ?? request.directory ?? process.cwd()), recording)
  const session = request.config
  const configured = await registry.configure(
    typeof session === "object" && session !== null && !Array.isArray(session) ? session as Record<string, unknown> : {},
  )
  send({
    id: request.id, type: "loaded",
    tools: result.tools.map((tool) => ({
      id: tool.id, description: tool.description, parameters: tool.parameters, origin: tool.origin,
      source: tool.source, init_ms: tool.initMs,
    })),
    load_errors: [...result.errors, ...configured.errors], hooks: result.hooks, notes: result.notes, logs: result.logs,
    ...(configured.config === undefined ? {} : { config: configured.config }), ...recording.field(),
  })
}

async function handle(request: Request): Promise<void> {
  const id = String(request.id ?? "")
  switch (request.type) {
    case "load":
      // Loads run one after the other; calls wait for the load that was asked before them.
      const work = loading.then(() => load(request))
      loading = work.catch(() => undefined)
      return work
    case "call":
      await loading
      return calls.call(id, String(request.tool), request.args, (request.context ?? {}) as Record<string, never>,
                        new Recording(traceOf(request)))
    case "hook":
      await loading
      return calls.hook(id, String(request.name), (request.input ?? {}) as Record<string, unknown>,
                        (request.output ?? {}) as Record<string, unknown>)
    case "ask_reply":
      return calls.answer(String(request.ask_id), request.allowed === true, String(request.message ?? ""))
    case "abort":
      return calls.abort(String(request.call), String(request.reason ?? "aborted"))
    case "ping":
      return send({ id, type: "pong" })
    default:
      send({ id, type: "error", message: `unknown request type ${String(request.type)}` })
  }
}

for await (const line of requestLines()) {
  let request: Request
  try {
    request = JSON.parse(line) as Request
  } catch {
    log(`ignored a line that is not JSON: ${line.slice(0, 200)}`)
    continue
  }
  const work = handle(request).catch((error) => {
    try {
      send({ id: request.id, type: "error", message: messageOf(error) })
    } catch {
      log(`failed to report an error: ${messageOf(error)}`)
    }
  })
  inFlight.add(work)
  void work.finally(() => inFlight.delete(work))
}
// The driver closed stdin: finish what was asked (it kills the host if that takes too long).
await Promise.allSettled([...inFlight])
exit(0)
