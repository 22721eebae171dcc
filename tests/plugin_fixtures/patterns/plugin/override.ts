// A plugin tool named like a built-in replaces it (real plugins override read, glob, bash...).
import { tool } from "@opencode-ai/plugin"

export const GlobOverride = async () => ({
  tool: {
    glob: tool({
      description: "Project glob (plugin override)",
      args: { pattern: tool.schema.string() },
      async execute(args) {
        return `override saw ${args.pattern}`
      },
    }),
  },
})
