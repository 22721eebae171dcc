// A date argument has no JSON Schema: the tool cannot be offered to a model.
import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Takes a date",
  args: { when: tool.schema.date() },
  async execute(args) { return String(args.when) },
})
