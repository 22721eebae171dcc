// Several tools in one file, the same definition under two names, and exports that are not tools.
import { tool } from "@opencode-ai/plugin"

export const VERSION = "2.1"
export function shout(text: string): string {
  return text.toUpperCase()
}

const reverse = tool({
  description: "Reverses a text",
  args: { text: tool.schema.string() },
  async execute(args) {
    return [...args.text].reverse().join("")
  },
})

export const upper = tool({
  description: "Upper-cases a text",
  args: { text: tool.schema.string() },
  async execute(args) {
    return shout(args.text)
  },
})

export default reverse
export { reverse as flip }
