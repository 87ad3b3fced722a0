"""oncelog.Admin is its API families (client/admin/, one module each, see the package's
__init__): every family class is a base of Admin, a family only calls what AdminBase has (never
another family's methods), and every name callers imported from client/admin/admin.py before
the split still imports from there."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import oncelog
from oncelog.client.admin import admin
from oncelog.client.admin.base import AdminBase

PACKAGE = Path(admin.__file__).parent


def families() -> dict[str, type]:
    """Every class on AdminBase defined in a module of client/admin/, by module."""
    found = {}
    for path in sorted(PACKAGE.glob("*.py")):
        module = importlib.import_module(f"oncelog.client.admin.{path.stem}")
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, AdminBase) and \
                    cls not in (AdminBase, admin.Admin) and cls.__module__ == module.__name__:
                found[path.stem] = cls
    return found


def test_every_family_is_a_base_of_admin():
    found = families()
    assert {"topics", "records", "configs", "groups", "transactions", "cluster"} <= set(found)
    assert set(admin.Admin.__bases__) == set(found.values())
    assert oncelog.Admin is admin.Admin


def _self_names(cls: type) -> set[str]:
    """The names a class's methods use on ``self``."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def test_a_family_uses_only_what_admin_base_has():
    base_source = ast.parse(inspect.getsource(AdminBase))
    base = set(dir(AdminBase)) | {n.attr for n in ast.walk(base_source)
                                  if isinstance(n, ast.Attribute)
                                  and isinstance(n.value, ast.Name) and n.value.id == "self"}
    for name, cls in families().items():
        own = set(vars(cls))
        borrowed = _self_names(cls) - own - base
        assert not borrowed, f"{name}.py uses another family's {sorted(borrowed)}"


def test_every_name_imported_from_admin_py_still_is():
    before_the_split = [
        "Admin", "AlterConfigOp", "BrokerDescription", "COORDINATOR_TRANSACTION",
        "ClusterDescription", "ClusterInfo", "ConfigEntry", "ConfigResource", "Coordinator",
        "FencedTransaction", "GroupInfo", "GroupListing", "LogDirDescription", "MemberInfo",
        "PartitionInfo", "PartitionReassignment", "ProducerInfo", "RESOURCE_TOPIC",
        "ReplicaInfo", "TopicDescription", "TopicInfo", "TransactionDescription",
        "TransactionListing"]
    assert [n for n in before_the_split if not hasattr(admin, n)] == []
    assert set(before_the_split) <= set(admin.__all__)
