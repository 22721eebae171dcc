"""The built-in tools the sandbox agent executes: one module per tool, each with `run(args, ctx)`."""
