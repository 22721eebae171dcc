"""Snapshot storages (core/sessions/snapshots.py is the port they implement)."""
