"""A tool call's arguments, from the model's (or an approver's) JSON text to the tool's typed model.

One home for every step, used wherever arguments are checked: before a reviewer is asked
(`check_arguments`), when the call runs (`execute_tool`), when an approver edits them
(`record_decision`), when a compensation reads the forward call's (`compensate_call`), and by the
MCP activities, whose arguments are a JSON object checked against a server's schema instead.

1. `load_arguments`: the text as a bounded JSON object the database can store;
2. `parse_arguments`: that object as the tool's arguments model (strict mode's nulls mapped back
   to defaults);
3. `validate`: both, with any failure as one VALIDATION_ERROR line the model can act on.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from countersign.core.bounds import loads_object
from tools.registry import IDENTITY_FIELDS, Tool, ToolArgs, ToolFailure


def load_arguments(raw: str) -> dict[str, Any]:
    """The arguments as a JSON object, or VALIDATION_ERROR: too deep or large, no object, not storable."""
    value, refusal = loads_object(raw)
    if value is None:
        raise ToolFailure("VALIDATION_ERROR", f"arguments {refusal}")
    return value


def parse_arguments(tool: Tool, raw: dict[str, Any]) -> ToolArgs:
    """Validate raw arguments; a null for a defaulted field means "use the default" (strict mode)."""
    cleaned = {
        k: v
        for k, v in raw.items()
        if not (
            v is None
            and k in tool.args_model.model_fields
            and not tool.args_model.model_fields[k].is_required()
        )
    }
    return tool.args_model.model_validate(cleaned)


def validation_message(err: ValidationError) -> str:
    """A pydantic error as one line the model can act on."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "arguments"
        hint = ""
        if e["type"] == "extra_forbidden" and str(e["loc"][-1]) in IDENTITY_FIELDS:
            hint = " (tenant, user and roles come from the conversation, never from arguments)"
        parts.append(f"{where}: {e['msg']}{hint}")
    return "; ".join(parts)


def validate(tool: Tool, raw: str) -> ToolArgs:
    """Parse and validate the model's (or an approver's) arguments, or raise VALIDATION_ERROR."""
    try:
        return parse_arguments(tool, load_arguments(raw))
    except ValidationError as err:
        raise ToolFailure("VALIDATION_ERROR", validation_message(err)) from err
    except (ArithmeticError, RecursionError) as err:  # a validator met a value beyond its range
        raise ToolFailure("VALIDATION_ERROR", f"arguments out of range ({type(err).__name__})") from err
