"""LangChain's own standard tests for chat models (``langchain-tests``), run on ChatAgentMem.

The unit suite checks the model's construction, serialisation and LangSmith parameters; the integration suite
drives the embedded SmolLM2-135M through invoke / stream / batch (sync and async), usage metadata, stop strings,
multi-turn and tool-calling conversations, required tool calls (``tool_choice``, held to the call's schema) and
``with_structured_output`` (LangChain's own, through a required call).
What it asks of the model's own judgement is marked below: a 135M-parameter model does not decide to call a tool
by itself, nor copy non-Latin text into a call's arguments.
"""

from __future__ import annotations

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from agentmem import AgentMemory
from agentmem_langgraph import ChatAgentMem


@pytest.fixture(scope="module")
def standard_memory(tmp_path_factory) -> AgentMemory:
    with AgentMemory(tmp_path_factory.mktemp("standard") / "mem") as mem:
        yield mem


class _Params:
    @pytest.fixture(autouse=True)
    def _memory(self, standard_memory: AgentMemory) -> None:
        self._mem = standard_memory

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return ChatAgentMem

    @property
    def chat_model_params(self) -> dict:
        # greedy, so each run asks the same of the model
        return {"memory": getattr(self, "_mem", None), "user_id": "u1", "max_new_tokens": 96, "temperature": 0}

    @property
    def has_tool_calling(self) -> bool:
        return True

    @property
    def has_tool_choice(self) -> bool:
        return True


class TestChatAgentMemUnit(_Params, ChatModelUnitTests):
    pass


@pytest.mark.slow
class TestChatAgentMemIntegration(_Params, ChatModelIntegrationTests):
    @pytest.mark.xfail(reason="SmolLM2-135M does not decide to call a tool unless tool_choice requires it",
                       strict=True)
    def test_agent_loop(self, model: BaseChatModel) -> None:
        super().test_agent_loop(model)

    @pytest.mark.xfail(reason="SmolLM2-135M writes a placeholder, not the Japanese name, into the required call",
                       strict=True)
    def test_unicode_tool_call_integration(self, model: BaseChatModel, *args, **kwargs) -> None:
        super().test_unicode_tool_call_integration(model, *args, **kwargs)
