// A project plugin that defines tools through its `tool` hook, using the plugin input ($, directory).
import type { Plugin } from "@opencode-ai/plugin"
import { tool } from "@opencode-ai/plugin"

export const Toolkit: Plugin = async ({ $, directory, worktree }) => {
  const listing = (await $`ls`.quiet().text()).split("\n").filter((name) => name.length > 0)
  return {
    tool: {
      kit_files: tool({
        description: "Lists what the project had when the plugin started",
        args: { limit: tool.schema.number().int().positive().optional() },
        async execute(args, context) {
          const names = listing.slice(0, args.limit ?? listing.length)
          return `${names.join(",")} (dir=${directory} tree=${worktree} ctxdir=${context.directory})`
        },
      }),
      "kit-status": tool({
        description: "A plugin tool whose id has a dash",
        args: {},
        async execute() {
          return { title: "status", output: "all good", metadata: { healthy: true } }
        },
      }),
    },
    // Plugins commonly adjust a tool's arguments in place and annotate its output.
    "tool.execute.before": async (input, output) => {
      if (input.tool === "multi_upper" && output.args.text === "hook me") output.args.text = "hooked"
    },
    "tool.execute.after": async (input, output) => {
      if (input.tool === "multi_flip" && input.args.text === "ab") {
        output.output += ` (after ${input.tool}, args ${JSON.stringify(input.args)}, call ${input.callID})`
      }
    },
  }
}

export default async function SecondPlugin() {
  return {
    tool: {
      kit_second: tool({ description: "From the default-exported plugin", args: {}, async execute() { return "second" } }),
    },
  }
}
