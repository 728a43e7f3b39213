"""The circuit breaker on the model endpoint: the real `call_model` activity (ActivityEnvironment)
against the scripted model over HTTP, with faults injected and the breaker's clock driven by hand."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.model import ModelActivities
from countersign.core.messages import ChatMessage, ModelReply, ModelRequest
from countersign.runtime.circuit import CircuitBreaker
from countersign.runtime.config import Settings
from countersign.scripted_model.server import Fault, ScriptedModelServer
from tests.activities.test_email import FakeClock
from tests.fixtures.scripted_model import scenario_from

REQUEST = ModelRequest(messages=[ChatMessage(role="user", content="hello")])


def activities(model: ScriptedModelServer, clock: FakeClock) -> ModelActivities:
    model.set_scenario(
        scenario_from(
            {"name": "t", "rules": [{"when": {"user_contains": "hello"}, "reply": {"content": "Hi"}}]}
        )
    )
    breaker = CircuitBreaker("model", failure_threshold=2, cool_down=30.0, clock=clock)
    return ModelActivities(Settings(llm_base_url=model.base_url), breaker=breaker)


async def call(acts: ModelActivities) -> ModelReply:
    reply: ModelReply = await ActivityEnvironment().run(acts.call_model, REQUEST)
    return reply


async def failing(acts: ModelActivities) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        await call(acts)
    return caught.value


async def test_consecutive_endpoint_failures_open_the_breaker_and_a_probe_closes_it(
    scripted_model: ScriptedModelServer,
) -> None:
    clock = FakeClock()
    acts = activities(scripted_model, clock)
    scripted_model.inject(Fault(status=503), Fault(status=500))
    assert (await failing(acts)).type == "ModelHTTP503"
    assert (await failing(acts)).type == "ModelHTTP500"
    sent = len(scripted_model.requests)

    clock.now += 10
    refused = await failing(acts)
    assert refused.type == "ModelCircuitOpen" and not refused.non_retryable
    assert refused.next_retry_delay is not None and refused.next_retry_delay.total_seconds() == pytest.approx(
        20
    )
    assert len(scripted_model.requests) == sent, "an open breaker sends nothing"

    clock.now += 20  # cool-down over: one probe goes through, and its success closes the breaker
    assert (await call(acts)).message.content == "[scripted model] Hi"
    assert acts.breaker.state == "closed"
    assert (await call(acts)).message.content == "[scripted model] Hi"


async def test_a_failed_probe_reopens_for_a_full_cool_down(scripted_model: ScriptedModelServer) -> None:
    clock = FakeClock()
    acts = activities(scripted_model, clock)
    scripted_model.inject(Fault(status=502), Fault(status=502), Fault(raw_body='{"trunc'))
    await failing(acts)
    await failing(acts)
    clock.now += 30
    assert (await failing(acts)).type == "ModelBadResponse"  # the probe got an unusable body
    refused = await failing(acts)
    assert refused.type == "ModelCircuitOpen" and refused.next_retry_delay is not None
    assert refused.next_retry_delay.total_seconds() == pytest.approx(30)


async def test_a_request_fault_is_an_answer_not_an_outage(scripted_model: ScriptedModelServer) -> None:
    """400/401/404 are this request's fault: the endpoint answered, so they reset the count."""
    clock = FakeClock()
    acts = activities(scripted_model, clock)
    scripted_model.inject(Fault(status=500), Fault(status=400), Fault(status=500), Fault(status=401))
    assert (await failing(acts)).type == "ModelHTTP500"
    assert (await failing(acts)).non_retryable
    assert (await failing(acts)).type == "ModelHTTP500"
    assert (await failing(acts)).type == "ModelHTTP401"
    assert acts.breaker.state == "closed"
    assert (await call(acts)).message.content == "[scripted model] Hi"
