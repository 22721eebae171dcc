"""The domain: sessions, executions and their rules. Imports neither grpc nor docker."""
