"""Scripted-model scenarios: the file format (CONTRACT.md, "Scripted model scenarios") and the matcher.

The matcher is pure: it maps the chat messages of one request to the reply of the first matching rule,
so tests exercise it without a server and the server stays a thin HTTP shell around it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class _Strict(BaseModel):
    """Unknown keys are errors: a typo like `user_contain` would otherwise silently match everything."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class When(_Strict):
    # one text, or several that must all appear ("score" and "jane": the lead the user asked about)
    user_contains: str | tuple[str, ...] | None = None
    # a regular expression the latest user message matches (case-insensitive); its named groups
    # fill the reply's arguments written "{name}" (the drafts page's "send draft 7" names draft 7)
    user_matches: str | None = Field(default=None, max_length=500)
    after_tool: str | None = None
    result_contains: str | None = None
    turn_calls: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _result_needs_tool(self) -> When:
        # Without `after_tool` the latest message must be the user's, so there is no result to search.
        if self.result_contains is not None and self.after_tool is None:
            raise ValueError("`result_contains` needs `after_tool` (it searches that tool's result)")
        if self.user_matches is not None:
            try:
                re.compile(self.user_matches)
            except re.error as err:
                raise ValueError(f"`user_matches` is not a regular expression: {err}") from None
        return self


class ScriptedCall(_Strict):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class Reply(_Strict):
    content: str | None = None
    tool_calls: list[ScriptedCall] = Field(default_factory=list)

    @model_validator(mode="after")
    def _not_empty(self) -> Reply:
        if self.content is None and not self.tool_calls:
            raise ValueError("a reply needs `content`, `tool_calls` or both")
        return self


class Rule(_Strict):
    when: When = Field(default_factory=When)
    reply: Reply


class Scenario(_Strict):
    name: str
    # The agent this script plays (its file then answers only that agent's conversations); None: any.
    agent: str | None = None
    rules: list[Rule]


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not follow the format; the message names the file."""


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a .yaml/.yml/.json scenario file."""
    path = Path(path)
    data = _parse(path)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(_describe(error) for error in exc.errors())
        raise ScenarioError(f"{path}: invalid scenario: {problems}") from exc


SCENARIO_SUFFIXES = (".yaml", ".yml", ".json")


def load_scenarios(path: str | Path) -> list[Scenario]:
    """A scenario file, or every scenario file of a directory (one per agent), in name order."""
    path = Path(path)
    if not path.is_dir():
        return [load_scenario(path)]
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in SCENARIO_SUFFIXES)
    if not files:
        raise ScenarioError(f"{path}: no scenario files (.yaml, .yml, .json) in this directory")
    scenarios = [load_scenario(p) for p in files]
    agents = [s.agent for s in scenarios]
    twice = sorted({a or "(any agent)" for a in agents if agents.count(a) > 1})
    if twice:
        raise ScenarioError(f"{path}: more than one scenario for {', '.join(twice)}")
    return scenarios


def scenario_for(scenarios: Sequence[Scenario], agent: str | None) -> Scenario | None:
    """The script that plays `agent`: its own, else one for any agent, else None."""
    own = next((s for s in scenarios if agent is not None and s.agent == agent), None)
    return own or next((s for s in scenarios if s.agent is None), None)


def _parse(path: Path) -> Any:
    suffix = path.suffix.lower()
    if suffix not in SCENARIO_SUFFIXES:
        raise ScenarioError(f"{path}: unsupported scenario file type {suffix!r} (use .yaml, .yml or .json)")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read scenario: {exc.strerror or exc}") from exc
    try:
        return json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        detail = " ".join(str(exc).split())  # YAML errors span several lines; keep one
        raise ScenarioError(f"{path}: not valid {suffix[1:].upper()}: {detail}") from exc


def _describe(error: Mapping[str, Any]) -> str:
    """`rules.1.when.after_tol: Extra inputs are not permitted`: where, then what."""
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    return f"{where}: {error['msg']}"


# --- the matcher -------------------------------------------------------------------------------------

Message = Mapping[str, Any]


def choose_reply(scenario: Scenario, messages: Sequence[Message]) -> Reply | None:
    """The reply of the first rule whose `when` all hold for this model turn, or None."""
    turn = _Turn(messages)
    rule = next((rule for rule in scenario.rules if turn.matches(rule.when)), None)
    if rule is None:
        return None
    if rule.when.user_matches is None or not rule.reply.tool_calls:
        return rule.reply
    found = re.search(rule.when.user_matches, turn.user_text, re.IGNORECASE)
    groups = {k: v for k, v in found.groupdict().items() if v is not None} if found else {}
    calls = [
        call.model_copy(update={"arguments": filled(call.arguments, groups)})
        for call in rule.reply.tool_calls
    ]
    return rule.reply.model_copy(update={"tool_calls": calls})


def filled(value: Any, groups: Mapping[str, str]) -> Any:
    """`value` with each "{name}" of a string replaced by the group `name` matched."""
    if isinstance(value, str):
        for name, text in groups.items():
            value = value.replace("{" + name + "}", text)
        return value
    if isinstance(value, dict):
        return {k: filled(v, groups) for k, v in value.items()}
    if isinstance(value, list):
        return [filled(v, groups) for v in value]
    return value


class _Turn:
    """What the rules look at in one request's messages, worked out once."""

    def __init__(self, messages: Sequence[Message]) -> None:
        last_user = _last_index(messages, "user")
        self.user_text = text_of(messages[last_user]).casefold() if last_user is not None else ""
        since_user = messages if last_user is None else messages[last_user + 1 :]
        self.calls_since_user = sum(1 for m in since_user if m.get("role") == "tool")
        latest = messages[-1] if messages else {}
        self.latest_is_user = latest.get("role") == "user"
        self.latest_is_tool = latest.get("role") == "tool"
        self.tool_names = _tool_names(messages) if self.latest_is_tool else set()
        self.result_text = text_of(latest).casefold() if self.latest_is_tool else ""

    def matches(self, when: When) -> bool:
        if when.after_tool is None:
            if not self.latest_is_user:
                return False
        elif when.after_tool not in self.tool_names:
            return False
        if when.result_contains is not None and when.result_contains.casefold() not in self.result_text:
            return False
        if when.user_contains is not None:
            texts = (when.user_contains,) if isinstance(when.user_contains, str) else when.user_contains
            if any(text.casefold() not in self.user_text for text in texts):
                return False
        if when.user_matches is not None and not re.search(when.user_matches, self.user_text, re.IGNORECASE):
            return False
        return when.turn_calls is None or when.turn_calls == self.calls_since_user


def _last_index(messages: Sequence[Message], role: str) -> int | None:
    return next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == role), None)


def _tool_names(messages: Sequence[Message]) -> set[str]:
    """Names the latest (tool) message answers to: its own `name`, and the call it answers by id."""
    latest = messages[-1]
    names = {latest["name"]} if isinstance(latest.get("name"), str) else set()
    assistant = _last_index(messages, "assistant")
    if assistant is not None:
        for call in messages[assistant].get("tool_calls") or []:
            if isinstance(call, Mapping) and call.get("id") == latest.get("tool_call_id"):
                function = call.get("function")
                if isinstance(function, Mapping) and isinstance(function.get("name"), str):
                    names.add(function["name"])
    return names


def text_of(message: Message) -> str:
    """A message's text: `content` is a string, null, or a list of parts (`{"type": "text", "text"}`)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""
