"""Framework backends: chatledger as the persistence layer of other agent frameworks.

Each backend is a subpackage behind its own extra (`pip install
chatledger[pydantic-ai]`), imports `store` and never `engine`, and is imported
by nothing in `store` or `engine`.
"""
