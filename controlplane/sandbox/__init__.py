"""Sandboxes: the provider interface, its Docker and local implementations, the agent channel."""
