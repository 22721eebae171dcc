// A plain JavaScript tool in the plural `tools` directory.
import { tool } from "@opencode-ai/plugin"

/** Joins words with a separator. */
export default tool({
  description: "Joins words (plain JS)",
  args: {
    words: tool.schema.array(tool.schema.string()).min(1).describe("Words to join"),
    separator: tool.schema.string().default(" "),
  },
  async execute(args) {
    return args.words.join(args.separator)
  },
})
