"""The interface to wherever sandboxes run: providers, agents, and the messages they carry."""
