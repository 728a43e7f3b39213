"""The scripted, OpenAI-compatible model server that stands in for an LLM in the demo and the tests."""

from countersign.scripted_model.scenario import (
    Reply,
    Rule,
    Scenario,
    ScenarioError,
    ScriptedCall,
    When,
    choose_reply,
    load_scenario,
)
from countersign.scripted_model.server import Fault, ScriptedModelServer

__all__ = [
    "Fault",
    "Reply",
    "Rule",
    "Scenario",
    "ScenarioError",
    "ScriptedCall",
    "ScriptedModelServer",
    "When",
    "choose_reply",
    "load_scenario",
]
