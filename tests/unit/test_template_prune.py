"""Which template images are removed: only this instance's builds that no declared template uses, never an image
in use, never another instance's, never one without the template label."""

from __future__ import annotations

from controlplane.sandbox.template_prune import BuiltImage, prunable

ME = "plane-a"


def image(ident: str, *tags: str, template: str = "node", instance: str = ME) -> BuiltImage:
    return BuiltImage(ident, tags, template, instance)


def ids(images: list[BuiltImage]) -> list[str]:
    return [i.id for i in images]


def test_an_undeclared_template_and_an_old_tag_of_a_declared_one_go() -> None:
    found = [image("sha256:cur", "ocsb-template-node:new"), image("sha256:old", "ocsb-template-node:old"),
             image("sha256:gone", "ocsb-template-rust:1", template="rust")]
    assert ids(prunable(found, ME, {"node": "ocsb-template-node:new"}, set())) == ["sha256:old", "sha256:gone"]


def test_nothing_declared_removes_every_one_of_this_instance() -> None:
    found = [image("sha256:a", "ocsb-template-node:1"), image("sha256:b", template="rust")]
    assert ids(prunable(found, ME, {}, set())) == ["sha256:a", "sha256:b"]


def test_an_image_in_use_stays_whatever_its_labels() -> None:
    found = [image("sha256:live", "ocsb-template-node:old"), image("sha256:base", "ocsb-sandbox:latest")]
    assert prunable(found, ME, {"node": "ocsb-template-node:new"}, {"sha256:live", "sha256:base"}) == []


def test_another_instances_build_and_an_unlabelled_image_stay() -> None:
    found = [image("sha256:theirs", "ocsb-template-node:old", instance="plane-b"),
             image("sha256:plain", "ocsb-sandbox:latest", template="")]
    assert prunable(found, ME, {}, set()) == []


def test_a_template_whose_tag_is_unknown_keeps_all_of_its_images() -> None:
    # Its Dockerfile could not be read at this start, or it is a prebuilt `image =`: nothing of it is judged.
    found = [image("sha256:one", "ocsb-template-node:1"), image("sha256:two", "ocsb-template-node:2")]
    assert prunable(found, ME, {"node": ""}, set()) == []


def test_an_image_tagged_both_current_and_old_stays() -> None:
    both = image("sha256:same", "ocsb-template-node:old", "ocsb-template-node:new")
    assert prunable([both], ME, {"node": "ocsb-template-node:new"}, set()) == []
