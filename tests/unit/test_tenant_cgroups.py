"""Tenant CPU parents' names and checks, without an engine: names unique per plane and tenant that do not give a
tenant's name away, the host's cgroup mounts as /proc lists them, and the process check read from the real /proc."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.sandbox.tenant_cgroups import (
    cgroup_mounts,
    cpu_group_of,
    group_name,
    parent_problems,
    process_problem,
)


def test_names_are_per_instance_and_tenant_and_do_not_name_the_tenant() -> None:
    names = {group_name(i, t) for i in ("a", "a-b") for t in ("", "acme", "acme/../x", "ACME")}
    assert len(names) == 8
    assert all(n.startswith(("ocsb-a/", "ocsb-a-b/")) for n in names)
    assert all("acme" not in n.lower() and ".." not in n for n in names)
    assert group_name("a", "") == "ocsb-a/pool"


def test_mounts_are_read_from_the_mount_table() -> None:
    found = cgroup_mounts()
    assert found, "this host mounts no cgroup hierarchy"
    assert all(kind in ("cgroup", "cgroup2") and mount.is_dir() for mount, kind, _ in found)


def test_a_process_outside_the_parent_is_a_problem_and_inside_is_not() -> None:
    own = cpu_group_of(os.getpid())
    inside = {"HostConfig": {"CgroupParent": str(Path(own).parent)}, "State": {"Pid": os.getpid()}}
    outside = {"HostConfig": {"CgroupParent": "/ocsb-elsewhere/t-0"}, "State": {"Pid": os.getpid()}}
    if own != "/":
        assert process_problem(inside) is None
    assert "not under '/ocsb-elsewhere/t-0'" in str(process_problem(outside))
    assert process_problem({"HostConfig": {}, "State": {"Pid": os.getpid()}}) is None  # no parent asked for
    gone = {"HostConfig": {"CgroupParent": "/ocsb-x/t-0"}, "State": {"Pid": 0}}
    assert "could not be read" in str(process_problem(gone))


def test_the_engine_must_report_the_parent_asked_for() -> None:
    assert parent_problems({"HostConfig": {"CgroupParent": "/ocsb-a/t-1"}}, "/ocsb-a/t-1") == []
    assert parent_problems({"HostConfig": {"CgroupParent": ""}}, "/ocsb-a/t-1") == [
        "the container's cgroup parent is '', not '/ocsb-a/t-1'"]
    assert parent_problems({"HostConfig": {}}, None) == []
