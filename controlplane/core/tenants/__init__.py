"""Tenants as the operator manages them: their records and tokens, their quotas, their lifecycle."""
