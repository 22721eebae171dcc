import { tool } from "@opencode-ai/plugin"
export default tool({ description: "never loaded: .mjs is not scanned", args: {}, async execute() { return "x" } })
