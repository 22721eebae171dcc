"""Durable state: SQLite under the data dir."""
