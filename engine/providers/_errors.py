"""The errors a model adapter raises.

```
store.ChatledgerError
└── ModelError                 a model request failed for good
    ├── ModelConfigError       the adapter is not configured (no API key, bad base URL)
    ├── ModelRequestError      the request cannot be expressed for this provider
    ├── ModelConnectionError   no HTTP response: refused, reset, timed out (after retries)
    ├── ModelHTTPError         the provider answered with an error status (after retries)
    └── ModelResponseError     the provider's answer could not be understood
        └── ModelStreamError   a streamed answer was cut off or malformed midway
```

httpx errors become these in exactly one place, `engine.providers._http`.
Every error carries `provider` (e.g. `openai`), so a caller can tell where a
failure came from without parsing the message.
"""

from __future__ import annotations

from chatledger.store._errors import ChatledgerError

__all__ = [
    "ModelConfigError",
    "ModelConnectionError",
    "ModelError",
    "ModelHTTPError",
    "ModelRequestError",
    "ModelResponseError",
    "ModelStreamError",
]


class ModelError(ChatledgerError):
    """A model request failed for good.

    Attributes:
        provider: the adapter's provider name (`openai`, `anthropic`, `scripted`).
    """

    def __init__(self, message: str, *, provider: str | None = None) -> None:
        self.provider = provider
        super().__init__(message)


class ModelConfigError(ModelError):
    """The adapter is missing configuration it needs, such as an API key."""


class ModelRequestError(ModelError):
    """The request cannot be expressed in this provider's wire format.

    Raised by `prepare()` before anything is sent, e.g. for a tool call without
    an id, or an attachment type the provider does not accept.
    """


class ModelConnectionError(ModelError):
    """No HTTP response arrived: the connection failed or timed out, on every attempt.

    Attributes:
        url: the endpoint.
        attempts: how many times the request was sent.
    """

    def __init__(self, message: str, *, provider: str, url: str, attempts: int) -> None:
        self.url = url
        self.attempts = attempts
        super().__init__(message, provider=provider)


class ModelHTTPError(ModelError):
    """The provider answered with an error status, and retrying did not help.

    Attributes:
        status: the HTTP status code.
        body: the provider's error body, as text.
        retry_after: seconds the provider asked to wait (`Retry-After`), or None.
        url: the endpoint.
        attempts: how many times the request was sent.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int,
        body: str,
        retry_after: float | None,
        url: str,
        attempts: int,
    ) -> None:
        self.status = status
        self.body = body
        self.retry_after = retry_after
        self.url = url
        self.attempts = attempts
        super().__init__(message, provider=provider)


class ModelResponseError(ModelError):
    """The provider's answer could not be understood.

    Attributes:
        body: the offending payload (possibly shortened), as text.
    """

    def __init__(self, message: str, *, provider: str, body: str = "") -> None:
        self.body = body
        super().__init__(message, provider=provider)


class ModelStreamError(ModelResponseError):
    """A streamed answer ended before it was complete, or carried an error midway.

    Deltas already passed to `on_delta` stay delivered; the stream is not
    retried, because a retry would deliver them twice.
    """
