"""What a tool is: its schema, argument validation, the registry, custom tool specs and reloads."""
