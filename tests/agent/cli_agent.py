"""An agent importable as `tests.agent.cli_agent:agent`, for the CLI tests."""

from tests.agent.helpers import weather_agent

agent = weather_agent()
