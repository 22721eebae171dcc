// Returns every kind of value real tools return, and throws the ways they throw.
import { tool } from "@opencode-ai/plugin"

const kinds: Record<string, () => unknown> = {
  text: () => "plain text",
  empty: () => "",
  number: () => 42,
  boolean: () => false,
  nothing: () => undefined,
  none: () => null,
  list: () => ["a", 1],
  record: () => ({ ok: true, items: [1, 2] }),
  full: () => ({ title: "Done", output: "the output", metadata: { rows: 3 } }),
  bare: () => ({ output: "only output" }),
  big: () => Array.from({ length: 2001 }, (_, i) => `line ${i + 1}`).join("\n"),
  chatty: () => {
    console.log("to stdout")
    console.error("to stderr")
    process.stdout.write("raw stdout\n")
    Bun.spawnSync(["echo", "child stdout"], { stdout: "inherit" })
    return "printing did not disturb the result"
  },
}

export default tool({
  description: "Returns a value of the kind asked for",
  args: { kind: tool.schema.enum(Object.keys(kinds) as [string, ...string[]]) },
  async execute(args) {
    return kinds[args.kind]()
  },
})

export const fail = tool({
  description: "Throws the way it is told",
  args: { how: tool.schema.enum(["error", "type", "string", "object", "async"]) },
  async execute(args) {
    if (args.how === "error") throw new Error("the deploy key is missing")
    if (args.how === "type") throw new TypeError("expected a list")
    if (args.how === "string") throw "plain string thrown"
    if (args.how === "object") throw { code: 7 }
    await new Promise((resolve) => setTimeout(resolve, 5))
    return Promise.reject(new Error("rejected later"))
  },
})

// The other ways real files spell a tool: a synchronous execute and an arrow-function property.
export const sync = tool({
  description: "Answers synchronously",
  args: { n: tool.schema.number() },
  execute(args) {
    return `sync ${args.n * 2}`
  },
})

export const arrow = tool({
  description: "Answers from an arrow function",
  args: { n: tool.schema.number() },
  execute: async ({ n }, { agent }) => `arrow ${n + 1} for ${agent}`,
})
