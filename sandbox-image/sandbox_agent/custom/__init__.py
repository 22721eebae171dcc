"""Custom tools and project plugins: the long-lived tool hosts (Bun, Python) and their driver."""
