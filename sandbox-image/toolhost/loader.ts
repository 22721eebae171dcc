// Loads tool and plugin files, turns their definitions into host tools, and remembers what it loaded
// so that a re-load imports only the files whose mtime or size changed.
import { statSync } from "node:fs"
import { basename, extname } from "node:path"
import { z } from "zod"
import { pluginClient } from "./client.ts"
import { type LogLine, LogSink, logScope, whileImporting } from "./console_capture.ts"
import { type Recording, UNTRACED, unixMs } from "./tracing.ts"

export type Problem = { origin: string; message: string }
export type FileSpec = { path: string; kind: "tool" | "plugin" }
export type ToolSource = "CUSTOM" | "PLUGIN"
export type Execute = (args: unknown, ctx: unknown) => unknown

export type HostTool = {
  id: string
  description: string
  parameters: Record<string, unknown>
  origin: string
  source: ToolSource
  initMs: number
  schema: z.ZodObject
  declared: Set<string>
  execute: Execute
}

export type PluginHooks = { origin: string; hooks: Record<string, unknown> }

type FileState = {
  version: string
  kind: FileSpec["kind"]
  tools: HostTool[]
  errors: Problem[]
  notes: Problem[]
  plugins: PluginHooks[]
  /** What the file printed while it was imported and its plugins initialised (console_capture.ts). */
  logs: LogLine[]
}

export type LoadResult = { tools: HostTool[]; errors: Problem[]; notes: Problem[]; hooks: string[]; logs: LogLine[] }
export type Configured = { config?: string; errors: Problem[] }

export const PLUGIN_INIT_LIMIT_MS = 10_000
/** The most the config the hooks leave may weigh as JSON; more is not kept (it travels in every listing). */
export const CONFIG_LIMIT_CHARS = 1 << 20

export function messageOf(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0) {
    // Bun reports a module that does not build as an AggregateError of positioned build messages.
    const details = error.errors.map((item) => {
      const at = item?.position ? ` (${item.position.file}:${item.position.line}:${item.position.column})` : ""
      return `${messageOf(item)}${at}`
    })
    return `${error.message}: ${details.join("; ")}`
  }
  if (error instanceof Error) return error.message
  return String(error)
}

export async function withTimeout<T>(work: Promise<T>, limitMs: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${limitMs / 1000} s`)), limitMs)
  })
  try {
    return await Promise.race([work, expired])
  } finally {
    clearTimeout(timer)
  }
}

function isZodSchema(value: unknown): value is z.ZodType {
  // Duck-typed too: a project may bring its own copy of zod 4, whose classes are not ours.
  return value instanceof z.ZodType || (typeof value === "object" && value !== null && "_zod" in value &&
    typeof (value as { safeParse?: unknown }).safeParse === "function")
}

function objectSchema(args: unknown): z.ZodObject {
  // Upstream builds `z.object(def.args)`, which takes a missing shape as an empty one.
  if (args === undefined || args === null) return z.object({})
  if (isZodSchema(args)) {
    if ((args as { _zod: { def: { type: string } } })._zod.def.type !== "object") {
      throw new Error("args must be a zod raw shape or a z.object(...)")
    }
    return args as z.ZodObject
  }
  for (const [key, value] of Object.entries(args as Record<string, unknown>)) {
    if (!isZodSchema(value)) throw new Error(`args.${key} is not a zod schema`)
  }
  return z.object(args as z.ZodRawShape)
}

/** Why `value` is not a tool definition, or undefined when it is one. */
function notATool(value: unknown): string | undefined {
  if (typeof value !== "object" || value === null) return value === null ? "null" : `a ${typeof value}`
  const candidate = value as Record<string, unknown>
  if (typeof candidate.execute !== "function") return "no execute function"
  if (typeof candidate.description !== "string") return "no description"
  if (candidate.args !== undefined && candidate.args !== null && typeof candidate.args !== "object") {
    return `args that are a ${typeof candidate.args}`
  }
  return undefined
}

function makeTool(id: string, definition: Record<string, unknown>, origin: string, source: ToolSource,
                  startedMs: number): HostTool {
  const schema = objectSchema(definition.args)
  const parameters = z.toJSONSchema(schema) as Record<string, unknown>
  return {
    id, description: definition.description as string, parameters, origin, source,
    initMs: Math.round((performance.now() - startedMs) * 1000) / 1000,
    schema, declared: new Set(Object.keys(schema.shape)),
    // Called on its definition, as upstream's `def.execute(args, ctx)` is: `this` is the definition.
    execute: (args, ctx) => (definition.execute as Execute).call(definition, args, ctx),
  }
}

function sortedExports(module: Record<string, unknown>): [string, unknown][] {
  // Code-unit order of export names, whatever order the module declared them in.
  return Object.keys(module).sort().map((name) => [name, module[name]])
}

export class Registry {
  private files = new Map<string, FileState>()
  private imports = new Map<string, number>()
  tools = new Map<string, HostTool>()
  plugins: PluginHooks[] = []

  async load(files: FileSpec[], directory: string, worktree: string, recording: Recording = UNTRACED):
    Promise<LoadResult> {
    const next = new Map<string, FileState>()
    for (const file of files) {
      const version = fileVersion(file.path)
      const known = this.files.get(file.path)
      const state = known && known.version === version && known.kind === file.kind && version !== ""
        ? known
        : await this.loadFile(file, version, directory, worktree, recording)
      next.set(file.path, state)
    }
    this.files = next
    return this.publish(files)
  }

  private publish(files: FileSpec[]): LoadResult {
    const ordered = [...files.filter((f) => f.kind === "tool"), ...files.filter((f) => f.kind === "plugin")]
    const tools = new Map<string, HostTool>()
    const errors: Problem[] = []
    const notes: Problem[] = []
    const plugins: PluginHooks[] = []
    const logs: LogLine[] = []
    for (const file of ordered) {
      const state = this.files.get(file.path)!
      logs.push(...state.logs)
      errors.push(...state.errors)
      notes.push(...state.notes)
      plugins.push(...state.plugins)
      for (const tool of state.tools) {
        const earlier = tools.get(tool.id)
        if (earlier) notes.push({ origin: tool.origin, message: `tool ${tool.id} replaces the one from ${earlier.origin}` })
        tools.set(tool.id, tool) // a later definition wins but keeps the first one's place, like a JS object key
      }
    }
    this.tools = tools
    this.plugins = plugins
    const hooks = new Set<string>()
    for (const plugin of plugins) {
      for (const [name, value] of Object.entries(plugin.hooks)) if (name !== "tool" && typeof value === "function") hooks.add(name)
    }
    return { tools: [...tools.values()], errors, notes, hooks: [...hooks].sort(), logs }
  }

  /**
   * Runs the plugins' `config` hooks in load order on a copy of the session's opencode.json, as upstream's
   * plugin init does on its live config; returns the result as JSON, or no config when no plugin has the
   * hook. A hook that throws or times out is reported and the next one runs on what the config is by then.
   */
  async configure(session: Record<string, unknown>): Promise<Configured> {
    const hooks = this.plugins.filter((p) => typeof p.hooks.config === "function")
    if (hooks.length === 0) return { errors: [] }
    const config: Record<string, unknown> = structuredClone(session)
    // Upstream's loaded config always has these, so plugins add to them without checking.
    config.agent ??= {}
    config.mode ??= {}
    config.plugin ??= []
    const errors: Problem[] = []
    for (const plugin of hooks) {
      try {
        const hook = plugin.hooks.config as (config: unknown) => unknown
        await withTimeout(Promise.resolve(hook.call(plugin.hooks, config)), PLUGIN_INIT_LIMIT_MS, "config hook")
      } catch (error) {
        errors.push({ origin: plugin.origin, message: `config hook: ${messageOf(error)}` })
      }
    }
    try {
      const text = JSON.stringify(config)
      if (typeof text !== "string" || !text.startsWith("{")) throw new Error("the config is no longer an object")
      if (text.length > CONFIG_LIMIT_CHARS) throw new Error(`it is larger than ${CONFIG_LIMIT_CHARS} characters`)
      return { config: text, errors }
    } catch (error) {
      errors.push({ origin: hooks[0].origin, message: `config hook: the config cannot be kept: ${messageOf(error)}` })
      return { errors }
    }
  }

  private async loadFile(file: FileSpec, version: string, directory: string, worktree: string,
                         recording: Recording): Promise<FileState> {
    // The file's lines stay with it: a later load that keeps the file (unchanged) lists them again.
    const sink = new LogSink()
    const request = logScope.getStore()?.request ?? ""
    const state = await logScope.run({ request, origin: file.path, sink },
                                     () => this.importFile(file, version, directory, worktree, recording, sink))
    state.logs = sink.all(file.path)
    return state
  }

  private async importFile(file: FileSpec, version: string, directory: string, worktree: string,
                           recording: Recording, sink: LogSink): Promise<FileState> {
    const state: FileState = { version, kind: file.kind, tools: [], errors: [], notes: [], plugins: [], logs: [] }
    const started = performance.now()
    let module: Record<string, unknown>
    try {
      module = await this.importFresh(file.path)
    } catch (error) {
      state.errors.push({ origin: file.path, message: messageOf(error) })
      // A file that does not load has no tool id yet: its span is named after the file's default id.
      recording.start(`init_tool ${basename(file.path, extname(file.path))}`, initAttributes(file, undefined),
                      unixMs(started))?.fail(messageOf(error)).end()
      return state
    }
    const imported = performance.now()
    const known = state.tools.length
    const errors = state.errors.length
    if (file.kind === "tool") this.collectTools(file.path, module, started, state)
    else await this.callPlugins(file.path, module, started, directory, worktree, state)
    if (recording.trace !== undefined) traceInits(recording, file, state, known, errors, started, imported, sink.lines)
    return state
  }

  private async importFresh(path: string): Promise<Record<string, unknown>> {
    // Bun caches modules by specifier: a query string makes a changed file import anew.
    const count = this.imports.get(path) ?? 0
    this.imports.set(path, count + 1)
    const scope = logScope.getStore()
    const load = () => import(count === 0 ? path : `${path}?v=${count}`)
    return (await (scope === undefined ? load() : whileImporting(scope, load))) as Record<string, unknown>
  }

  private collectTools(path: string, module: Record<string, unknown>, started: number, state: FileState): void {
    const stem = basename(path, extname(path))
    const imported = performance.now() - started // shared by every tool of the file
    for (const [name, value] of sortedExports(module)) {
      const reason = notATool(value)
      if (reason !== undefined) {
        state.notes.push({ origin: path, message: `export ${name} is not a tool definition (${reason}); skipped` })
        continue
      }
      const id = name === "default" ? stem : `${stem}_${name}`
      try {
        state.tools.push(makeTool(id, value as Record<string, unknown>, path, "CUSTOM", performance.now() - imported))
      } catch (error) {
        state.errors.push({ origin: path, message: `tool ${id}: ${messageOf(error)}` })
      }
    }
  }

  private async callPlugins(path: string, module: Record<string, unknown>, started: number, directory: string,
                            worktree: string, state: FileState): Promise<void> {
    const input = {
      directory, worktree, project: { id: "sandbox", worktree }, serverUrl: new URL("http://localhost:0"),
      client: await pluginClient(directory), $: Bun.$.cwd(directory),
    }
    const seen = new Set<unknown>()
    for (const [name, value] of sortedExports(module)) {
      if (typeof value !== "function") {
        state.notes.push({ origin: path, message: `export ${name} is not a plugin function; skipped` })
        continue
      }
      if (seen.has(value)) continue
      seen.add(value)
      let hooks: unknown
      try {
        hooks = await withTimeout(Promise.resolve(value(input)), PLUGIN_INIT_LIMIT_MS, `plugin ${name}`)
      } catch (error) {
        state.errors.push({ origin: path, message: `plugin ${name}: ${messageOf(error)}` })
        continue
      }
      if (typeof hooks !== "object" || hooks === null) continue
      const entries = hooks as Record<string, unknown>
      state.plugins.push({ origin: path, hooks: entries })
      const toolMap = entries.tool
      if (typeof toolMap !== "object" || toolMap === null) continue
      // Plugin tools share the cost of importing the file and running the plugin function.
      const shared = performance.now() - started
      for (const [id, definition] of Object.entries(toolMap as Record<string, unknown>)) {
        const reason = notATool(definition)
        if (reason !== undefined) {
          state.notes.push({ origin: path, message: `plugin tool ${id} is not a tool definition (${reason}); skipped` })
          continue
        }
        try {
          state.tools.push(makeTool(id, definition as Record<string, unknown>, path, "PLUGIN", performance.now() - shared))
        } catch (error) {
          state.errors.push({ origin: path, message: `tool ${id}: ${messageOf(error)}` })
        }
      }
    }
  }
}

function initAttributes(file: FileSpec, id: string | undefined): Record<string, string> {
  const attributes: Record<string, string> = {
    "sandbox.tool.origin": file.path, "sandbox.tool.source": file.kind === "tool" ? "custom" : "plugin",
  }
  if (id !== undefined) attributes["gen_ai.tool.name"] = id
  return attributes
}

/** One `init_tool` span per tool the file defined (import plus its own conversion), and per failure. */
function traceInits(recording: Recording, file: FileSpec, state: FileState, firstTool: number, firstError: number,
                    started: number, imported: number, logs: LogLine[]): void {
  const startMs = unixMs(started)
  for (const tool of state.tools.slice(firstTool)) {
    // initMs counts the file's import plus this tool's schema conversion; the span lasts as long.
    const span = recording.start(`init_tool ${tool.id}`,
                                 { ...initAttributes(file, tool.id), "sandbox.init_ms": tool.initMs }, startMs)
    span?.event("module imported", unixMs(imported))
    // What the file printed while loading, each line an event (at most the sink's 50).
    for (const line of logs) span?.event("log", line.at, { "log.level": line.level, "log.text": line.text })
    span?.end(startMs + tool.initMs)
  }
  for (const problem of state.errors.slice(firstError)) {
    const id = /^(?:tool|plugin) ([^:]+):/.exec(problem.message)?.[1] ?? basename(file.path, extname(file.path))
    recording.start(`init_tool ${id}`, initAttributes(file, id), startMs)?.fail(problem.message).end()
  }
}

function fileVersion(path: string): string {
  try {
    const stat = statSync(path)
    return `${stat.mtimeMs}:${stat.size}`
  } catch {
    return ""
  }
}
