// Module patterns real tools use: relative helpers (extensionless and `.js` for a `.ts` file), JSON imports,
// a dependency vendored in the config dir's node_modules, import.meta and top-level await.
import { tool } from "@opencode-ai/plugin"
import { readFile } from "node:fs/promises"
import tally from "tallyfmt"
import { framed } from "./lib/format"
import { UNITS } from "./lib/units.js"
import defaults from "./lib/defaults.json"
import settings from "./lib/defaults.json" with { type: "json" }

const banner = (await readFile(new URL("./lib/defaults.json", import.meta.url), "utf8")).length
const loadedAt = await Promise.resolve("top-level await")

export default tool({
  description: `Shows its imports (${defaults.greeting})`,
  args: { items: tool.schema.array(tool.schema.string()).default([]) },
  async execute(args) {
    return [
      framed(defaults.greeting), UNITS.join(","), settings.limits.max, tally(args.items), banner > 0, loadedAt,
      import.meta.dir.endsWith("/.opencode/tool"), typeof import.meta.url,
    ].join("|")
  },
})
