"""How many leading tokens of a command name "the command" for a bash `always` pattern (upstream BashArity)."""

from __future__ import annotations

_ONE = (
    "cat cd chmod chown cp echo env export grep kill killall ln ls mkdir mv ps pwd rm rmdir sleep source tail "
    "touch unset which"
)
_TWO = (
    "bazel brew bun cargo cdk cf cmake composer consul crictl deno docker eksctl firebase flyctl git go gradle helm "
    "heroku hugo ip kind kubectl kustomize make mc minikube mongosh mysql mvn ng npm nvm nx openssl pip pipenv pnpm "
    "poetry podman psql pulumi pyenv python rake rbenv redis-cli rustup serverless skaffold sls sst swift systemctl "
    "terraform tmux turbo ufw vault vercel volta wp yarn"
)
_THREE = (
    "aws",
    "az",
    "gcloud",
    "gh",
    "doctl",
    "sfdx",
    "bun run",
    "bun x",
    "cargo add",
    "cargo run",
    "consul kv",
    "deno task",
    "docker builder",
    "docker compose",
    "docker container",
    "docker image",
    "docker network",
    "docker volume",
    "eksctl create",
    "git config",
    "git remote",
    "git stash",
    "ip addr",
    "ip link",
    "ip netns",
    "ip route",
    "kind create",
    "kubectl kustomize",
    "kubectl rollout",
    "mc admin",
    "npm exec",
    "npm init",
    "npm run",
    "npm view",
    "openssl req",
    "openssl x509",
    "pnpm dlx",
    "pnpm exec",
    "pnpm run",
    "podman container",
    "podman image",
    "pulumi stack",
    "terraform workspace",
    "vault auth",
    "vault kv",
    "yarn dlx",
    "yarn run",
)

ARITY: dict[str, int] = {
    **{name: 1 for name in _ONE.split()},
    **{name: 2 for name in _TWO.split()},
    **{prefix: 3 for prefix in _THREE},
}
"""Command prefix (tokens joined by one space) → how many tokens make up the command."""


def prefix(tokens: list[str]) -> list[str]:
    """The tokens that name the command: the longest prefix found in ARITY decides; unknown commands keep one.

    Flags are ordinary tokens here (`python -m pytest` → `python -m`), as upstream counts them.
    """
    for length in range(len(tokens), 0, -1):
        arity = ARITY.get(" ".join(tokens[:length]))
        if arity is not None:
            return tokens[:arity]
    return tokens[:1]
