"""The built-in tools: one module and one `.txt` description per tool."""
