"""The agent `chatledger serve --agent tests.service.cli_agent:agent` serves in the tests."""

from tests.agent.helpers import weather_agent
from tests.service.agents import blocking_agent

agent = weather_agent()

blocking = blocking_agent()
"""Waits inside its tool until cancelled: a run a test disconnects from."""
