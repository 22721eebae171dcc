"""The sync `Client` mirrors `AsyncClient` method for method, with the same parameters: a method added to one
and forgotten on the other fails here."""

from __future__ import annotations

import inspect

from controlplane.client import AsyncClient, Client


def public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")}


def parameters(signature: inspect.Signature) -> list[tuple[str, inspect._ParameterKind, object]]:
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


def test_both_clients_have_the_same_public_methods_and_parameters() -> None:
    async_side, sync_side = public_methods(AsyncClient), public_methods(Client)
    assert sorted(async_side) == sorted(sync_side)
    assert len(async_side) >= 19
    for name, signature in async_side.items():
        assert parameters(signature) == parameters(sync_side[name]), name


def test_both_are_context_managers() -> None:
    assert hasattr(AsyncClient, "__aenter__")
    assert hasattr(AsyncClient, "__aexit__")
    assert hasattr(Client, "__enter__")
    assert hasattr(Client, "__exit__")
