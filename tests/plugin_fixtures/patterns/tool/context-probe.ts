// Reports the ToolContext fields a tool can read, and where it runs.
import { tool } from "@opencode-ai/plugin"

export default tool({
  description: "Reports its context",
  args: {},
  async execute(_args, context) {
    return JSON.stringify({
      sessionID: typeof context.sessionID === "string" && context.sessionID.length > 0,
      messageID: context.messageID,
      callID: (context as { callID?: string }).callID,
      agent: context.agent,
      directory: context.directory,
      worktree: context.worktree,
      aborted: context.abort.aborted,
      abortIsSignal: context.abort instanceof AbortSignal,
      metadataIsFunction: typeof context.metadata === "function",
      askIsFunction: typeof context.ask === "function",
      messages: Array.isArray((context as { messages?: unknown }).messages),
      cwd: process.cwd(),
    })
  },
})
