#!/usr/bin/env bash
# Runs a command in a session of its own (setsid), so that a signal to the process group of whoever
# started it (a supervisor stopping `make run`, `timeout`, Ctrl-C in the shell) never reaches it: the
# Docker engine must outlive the command that happened to start it. Says the new pid on stderr.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: detached.sh CMD [ARGS...]" >&2; exit 2; }
setsid "$@" </dev/null &
echo "detached.sh: started $1 as pid $!" >&2
