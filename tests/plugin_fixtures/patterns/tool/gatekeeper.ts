// Asks for permission the ways real tools do: a plain ask, an ask with no patterns, and a refusal caught.
import { tool } from "@opencode-ai/plugin"

export const deploy = tool({
  description: "Asks before deploying to a target",
  args: { target: tool.schema.string() },
  async execute(args, context) {
    await context.ask({
      permission: "deploy", patterns: [args.target], always: [`${args.target.split("/")[0]}/*`],
      metadata: { target: args.target },
    })
    context.metadata({ title: `deploying ${args.target}`, metadata: { target: args.target } })
    return `deployed ${args.target}`
  },
})

export const unscoped = tool({
  description: "Asks with an empty pattern list",
  args: {},
  async execute(_args, context) {
    await context.ask({ permission: "deploy", patterns: [], always: [], metadata: {} })
    return "nothing to ask"
  },
})

export const careful = tool({
  description: "Catches a refused permission and reports it",
  args: { target: tool.schema.string() },
  async execute(args, context) {
    try {
      await context.ask({ permission: "deploy", patterns: [args.target], always: [], metadata: {} })
      return "allowed"
    } catch (error) {
      return `refused: ${(error as Error).message}`
    }
  },
})
