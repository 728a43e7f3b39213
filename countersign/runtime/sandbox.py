"""The SDK's workflow sandbox, entered for less (issue 36).

The sandbox enters a workflow's isolated module globals with `exec` of a short source string: to
create each run's instance, for every activation, and, for every payload a workflow task carries
(six passes over each activation and its completion), to ask the workflow for its serialization
context. In issue 36's profile those calls were Countersign's largest single cost beside its
guarantees' statements. Two changes, nothing else:

- `exec` of a string compiles it every time: here each string is compiled once and its code object
  run, the same code in the same globals under the same import hook and restrictions.
- A payload's serialization context is the SDK's own lookup of the pending command (an activity's
  or child workflow's ids and types, as a frozen dataclass): no workflow code and no import runs in
  it, so it is asked directly instead of through the import hook, still flagged as in the sandbox.
  Workflow code (instances, activations) still runs only under the hook.

`_Instance` and its attributes are the SDK's (its module is marked unstable): the stock runner is
used if the class moved, a worker whose sandbox instance lacks what this uses refuses to start (the
SDK creates one per workflow type when the worker starts), and `tests/runtime/test_sandbox.py`
holds both changes to the stock runner's behaviour on a test server. pyproject.toml pins temporalio
to the minor version this was written against (1.35), and `tests/runtime/test_sandbox_sdk_shape.py`
fails by name when the source of a method of `_Instance` that this relies on changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType
from typing import Any

from temporalio.converter import SerializationContext
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner
from temporalio.workflow import unsafe

try:  # the SDK's internals (the annotations' types, and the class extended)
    from temporalio.converter._extstore import StorageDriverStoreContext
    from temporalio.worker._command_aware_visitor import CommandInfo
    from temporalio.worker.workflow_sandbox._in_sandbox import InSandbox
    from temporalio.worker.workflow_sandbox._runner import _Instance as SdkInstance
except ImportError:  # pragma: no cover - an SDK that moved it: the stock runner (sandbox_runner)
    SdkInstance = None  # type: ignore[assignment,misc]


@functools.lru_cache(maxsize=256)
def compiled(source: str) -> CodeType:
    """`source` compiled as `exec` would compile it (same file name, so tracebacks read alike)."""
    return compile(source, "<string>", "exec")


@dataclass(frozen=True)
class CompiledSandboxRunner(SandboxedWorkflowRunner):
    """`SandboxedWorkflowRunner` whose instances compile their sandbox code once."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _compiled_instance_class()(det, self.runner_class, self.restrictions)


@functools.cache
def _compiled_instance_class() -> Callable[..., WorkflowInstance]:
    class CompiledInstance(SdkInstance):
        """The SDK's sandboxed instance, running each of its source strings compiled once, and
        asking for a payload's serialization context without swapping the interpreter's import
        machinery in and out around it."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # What _flagged uses of the SDK's instance. The worker creates one per workflow type
            # when it starts (the SDK's `prepare_workflow`): an SDK that renamed these stops the
            # worker there, not every workflow task later.
            if "__temporal_in_sandbox" not in self.globals_and_locals or not hasattr(
                self.importer, "restriction_context"
            ):
                raise RuntimeError("countersign.runtime.sandbox no longer matches the SDK's sandbox instance")

        def _run_code(self, code: str, **extra_globals: Any) -> None:
            super()._run_code(compiled(code), **extra_globals)  # type: ignore[arg-type]  # exec runs either

        # The contexts are the SDK's own lookups (the pending command's activity or child workflow,
        # as frozen dataclasses); no workflow code and no import runs in them. The stock runner
        # enters the sandbox's import hook for each (about 40 us, 37 times per agent step). Still
        # flagged as in the sandbox while they run, as the stock runner does.
        def get_serialization_context(self, command_info: CommandInfo | None) -> SerializationContext | None:
            with self._flagged() as sandbox:
                return sandbox.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: CommandInfo | None) -> StorageDriverStoreContext:
            with self._flagged() as sandbox:
                return sandbox.get_external_store_context(command_info)

        @contextmanager
        def _flagged(self) -> Iterator[InSandbox]:
            self.importer.restriction_context.is_runtime = True
            unsafe._set_in_sandbox(True)
            try:
                # the SDK types its globals as strings; this one is the run's InSandbox
                yield self.globals_and_locals["__temporal_in_sandbox"]  # type: ignore[misc]
            finally:
                unsafe._set_in_sandbox(False)
                self.importer.restriction_context.is_runtime = False

    return CompiledInstance


def sandbox_runner(**options: Any) -> SandboxedWorkflowRunner:
    """The worker's workflow runner: the compiled-once sandbox, or the SDK's own if its internals
    moved (the same checks either way; only the compiling differs)."""
    if SdkInstance is None or not callable(getattr(SdkInstance, "_run_code", None)):
        return SandboxedWorkflowRunner(**options)
    return CompiledSandboxRunner(**options)
