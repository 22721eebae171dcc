"""Sessions and what they own: the manager, its services, events, ids, models, workspace archives."""
