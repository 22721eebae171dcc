"""Durable state: SQLite under the data dir, or PostgreSQL shared by several control planes (docs/state.md)."""
