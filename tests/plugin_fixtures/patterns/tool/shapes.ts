// Exercises the zod features real tools put in `args`; execute echoes what it received.
import { tool } from "@opencode-ai/plugin"

const s = tool.schema

export default tool({
  description: "Echoes arguments of many zod shapes",
  args: {
    title: s.string().min(2).max(12).describe("A short title"),
    mode: s.enum(["fast", "slow"]).default("fast").describe("How to run"),
    count: s.coerce.number().int().min(1).max(5).default(2),
    tags: s.array(s.string()).optional(),
    owner: s.object({ name: s.string(), email: s.string().optional() }).optional(),
    id: s.union([s.string(), s.number()]).optional(),
    kind: s.literal("note").optional(),
    parent: s.string().nullable().optional(),
    slug: s.string().regex(/^[a-z-]+$/, "Slug must be lowercase letters and dashes").optional(),
    labels: s.record(s.string(), s.string()).optional(),
    dryRun: s.boolean().default(false),
  },
  async execute(args) {
    return JSON.stringify(args)
  },
})
