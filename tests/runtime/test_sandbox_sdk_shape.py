"""countersign/runtime/sandbox.py extends the SDK's private `_Instance` (temporalio 1.35.x, the
range pyproject.toml pins): it overrides three of its methods and relies on what `__init__` sets up.
A new SDK whose `_Instance` still imports can have changed what those methods do, and the
subclass would go on replacing them with the old behaviour. Each method's source is pinned here by
digest, so an upgrade fails by name and says what to re-check, instead of running on unread code.
"""

from __future__ import annotations

import hashlib
import inspect

import pytest
from temporalio.worker.workflow_sandbox._runner import _Instance

# sha256 of inspect.getsource(_Instance.NAME) in temporalio 1.35.0, with what sandbox.py assumes of it.
PINNED = {
    "__init__": (
        "5b6352d58264a97bc802b6111dfcecd58a24d57ba75d57ab723453949af44bcf",
        "it fills globals_and_locals['__temporal_in_sandbox'] with the run's InSandbox and sets "
        "self.importer (whose restriction_context CompiledInstance._flagged sets)",
    ),
    "_run_code": (
        "78055698bee1c0d36ba7c7272566d5c21a3f7d939b3cfdf6906735d8a45215cf",
        "it only exec()s its string in globals_and_locals (under _set_in_sandbox), so a code object "
        "compiled once runs the same (CompiledInstance._run_code)",
    ),
    "get_serialization_context": (
        "b4331d145cc4475828121d0670c49a5d0ed4128ecffc97bb7692fded3a877c3a",
        "it only asks __temporal_in_sandbox.get_serialization_context with is_runtime set, which "
        "CompiledInstance.get_serialization_context does without the import hook",
    ),
    "get_external_store_context": (
        "66d3ceaa5a824e05c8f04ee4dfefeff24fa56f60287291ccc37007781445862b",
        "it only asks __temporal_in_sandbox.get_external_store_context with is_runtime set, which "
        "CompiledInstance.get_external_store_context does without the import hook",
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_the_sdk_sandbox_instance_is_the_one_sandbox_py_was_written_against(name: str) -> None:
    digest, assumed = PINNED[name]
    source = inspect.getsource(getattr(_Instance, name))
    assert hashlib.sha256(source.encode()).hexdigest() == digest, (
        f"temporalio's _Instance.{name} changed (countersign/runtime/sandbox.py was written against "
        f"1.35.0): re-check that {assumed}; then run tests/runtime/test_sandbox.py and put the new "
        f"digest here, with the new range in pyproject.toml"
    )
