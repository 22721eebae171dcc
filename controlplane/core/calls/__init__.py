"""One tool call from validation to its result: the executor, hooks, truncation, abort, subcalls."""
