"""The agent `chatledger serve --agent tests.service.cli_agent:agent` serves in the tests."""

from tests.agent.helpers import weather_agent

agent = weather_agent()
