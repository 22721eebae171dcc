"""What upstream OpenCode means, shared by the control plane and the sandbox agent.

Both sides of the trust boundary must read a permission wildcard, a JavaScript value's text, a markdown
frontmatter and the list of built-in tools the same way, so each is written once, here. The package imports
only the standard library: the control plane's wheel ships it and the sandbox image copies it next to the
agent (Dockerfile.sandbox), where neither side's dependencies are installed.
"""
