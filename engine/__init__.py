"""chatledger's engine: the agent run loop over the event log."""

from store import __version__

__all__ = ["__version__"]
