"""Differential tests against upstream OpenCode v1.2.27 itself: cases recorded from the real binary's
`opencode debug agent <agent> --tool <id> --params <json>` (tests/oracle/record.py), replayed through our
public gRPC API in a real sandbox (tests/oracle/test_oracle.py)."""
