"""The agent's exception tree: every exception class of the agent process (sandbox_agent/, wherever it is
defined) derives from AgentError and is drawn here (tests/unit/test_error_tree.py holds both true). The Python
tool host is a process of its own, with its own root (pyhost/opencode_tool.py).

AgentError
├── SpawnError              the command could not be started (missing program, bad cwd)
├── ExhaustedError          the sandbox ran out of something (disk space, quota, files, processes)
├── WorkspacePathError      a path names something outside the workspace
├── ToolError               a tool call failed; its text is what the model reads (tools/base.py)
│   ├── PathChangedError    a checked path was swapped after the check (tools/safe_open.py)
│   ├── TooManyLinksError   a file's other hard links could not all be found (tools/safe_open.py)
│   └── HostCallError       a custom tool host call failed (custom/host.py)
├── MakeDirError            a parent directory could not be made (tools/safe_open.py)
├── PatchError              a patch is malformed or does not apply (tools/patch.py)
├── NodeFsError             a file operation of apply_patch failed, worded as Node's (tools/apply_patch.py)
├── OutputNotSavedError     a tool output could not be saved (saved_outputs.py)
├── SnapshotError           the session's custom code could not be snapshotted (custom/snapshot.py)
├── FrontmatterError        a frontmatter outside the supported YAML subset (custom/frontmatter.py)
├── ArchiveTooLargeError    a workspace archive expands past its limit (tario.py)
├── DestinationError        an archive's destination is not a directory inside the workspace (tario.py)
├── FileRefusedError        a files API call refused, with its gRPC status (fileops.py)
├── ServerIdentityError     a server did not reach its protected identity (server_identity.py)
├── SyscallFilterError      the syscall filter the control plane asked for is not in force (syscall_filter.py)
├── NetworkStartError       the session's network forwarder could not start (egress_forwarder.py)
├── FrameError              a framed stream broke its format (frames.py)
│   ├── FrameTooLargeError      a frame over the size limit
│   ├── StreamCutError          the connection ended inside a frame
│   └── _ResponseTooLargeError  a response over the size limit (its call ends RESOURCE_EXHAUSTED)
├── CallAbortedError        a framed call's handler ended it with a status (rpc_status.py)
├── RequestsLostError       a caller's request stream broke off before its end (rpc_status.py)
├── NoTLSError              TLS was asked of the agent's process, which loads none (no_tls.py)
├── LspStartError           a language server could not be started (lsp/servers.py)
└── LspError                a language server request failed (lsp/client.py)
    ├── LspServerExitedError    the server exited
    └── LspProtocolError        the server broke the protocol
"""


class AgentError(Exception):
    """Root of every error the agent raises on purpose."""

    status = "INVALID_ARGUMENT"
    """The gRPC status name an RPC ends with when this error refuses it."""


class SpawnError(AgentError):
    """The command could not be started."""

    status = "FAILED_PRECONDITION"


# Also a ValueError (a path is a bad value), as before the tree: handlers written for ValueError keep catching it.
class WorkspacePathError(AgentError, ValueError):
    """A path leaves the workspace."""


class ExhaustedError(AgentError):
    """The sandbox ran out of disk space, quota, file descriptors or processes: the call fails, the agent is fine."""

    status = "RESOURCE_EXHAUSTED"
