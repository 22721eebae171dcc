"""What a project's files say: opencode.json text, agents, plugins' config hooks, rule sources."""
