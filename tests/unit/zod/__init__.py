"""The zod 4.1.8 oracle: zod schemas, argument cases, and the golden output they produce."""
