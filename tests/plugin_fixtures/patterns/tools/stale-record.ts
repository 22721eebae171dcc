// zod 3's one-argument z.record() does not exist in zod 4: this file fails to load, alone.
import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Uses a zod 3 record",
  args: { binds: tool.schema.record(tool.schema.any()).optional() },
  async execute() { return "unreachable" },
})
