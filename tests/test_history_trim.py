"""trim_history and budget_history: cutting history where a request can start."""

from __future__ import annotations

import math
import sys
import types

import pytest

from chatledger.store import (
    DataPart,
    HistoryError,
    InvalidInputError,
    Message,
    TextPart,
    ToolCall,
    UrlPart,
    budget_history,
    trim_history,
)
from chatledger.store.history import approximate_tokens, tiktoken_counter
from tests.helpers import user


def answer(text: str = "answer") -> Message:
    return Message(role="assistant", content=text)


def calls(*ids: str) -> Message:
    return Message(role="assistant", tool_calls=[ToolCall(id=i, name="tool") for i in ids])


def result(call_id: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, content="ok")


def one_token(_: Message) -> int:
    return 1


# --- trim_history ----------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -3])
def test_trim_rejects_a_limit_below_one(limit: int) -> None:
    with pytest.raises(InvalidInputError, match="positive integer"):
        trim_history(limit)


@pytest.mark.parametrize("limit", [2.5, True, "10"])
def test_trim_rejects_a_limit_that_is_not_an_integer(limit: object) -> None:
    with pytest.raises(InvalidInputError):
        trim_history(limit)  # type: ignore[arg-type]


def test_trim_returns_short_histories_unchanged() -> None:
    history = [result("orphan"), answer(), user()]
    trimmed = trim_history(3)(history)
    assert trimmed == history
    assert all(a is b for a, b in zip(trimmed, history, strict=True))


def test_trim_returns_a_new_list() -> None:
    history = [user()]
    assert trim_history(5)(history) is not history


def test_trim_keeps_the_newest_messages_from_a_user_message() -> None:
    history = [user("1"), answer("1"), user("2"), answer("2"), user("3"), answer("3")]
    assert trim_history(4)(history) == history[2:]


def test_trim_skips_tool_results_whose_call_was_cut() -> None:
    history = [user("1"), calls("a", "b"), result("a"), result("b"), user("2"), answer()]
    assert trim_history(3)(history) == [user("2"), answer()]


def test_trim_skips_assistant_turns_whose_prompt_was_cut() -> None:
    history = [user("1"), answer("1"), calls("a"), result("a"), user("2"), answer("2")]
    assert trim_history(4)(history) == [user("2"), answer("2")]


def test_trim_raises_history_error_when_nothing_can_open_a_request() -> None:
    history = [user(), calls("a"), result("a"), answer()]
    with pytest.raises(HistoryError, match="Raise max_messages"):
        trim_history(3)(history)


def test_trim_never_splits_a_call_from_a_result_recorded_after_a_later_user_message() -> None:
    # Unrepaired input: a's result came in after the next prompt. Cutting at
    # that prompt would keep the result and lose its call; the cut moves on.
    history = [user("1"), calls("a"), user("2"), result("a"), user("3"), answer()]
    assert trim_history(5)(history) == [user("3"), answer()]


def test_trim_does_not_change_the_callers_list() -> None:
    history = [user("1"), answer("1"), user("2"), answer("2")]
    snapshot = list(history)
    trim_history(2)(history)
    assert history == snapshot


# --- budget_history --------------------------------------------------------------------


@pytest.mark.parametrize("budget", [0, -1])
def test_budget_rejects_a_budget_below_one(budget: int) -> None:
    with pytest.raises(InvalidInputError, match="positive integer"):
        budget_history(None, budget)


def test_budget_returns_a_history_that_fits_unchanged() -> None:
    history = [answer(), result("orphan"), user()]
    kept = budget_history(one_token, 3)(history)
    assert kept == history
    assert all(a is b for a, b in zip(kept, history, strict=True))


def test_budget_keeps_the_newest_messages_that_fit_from_a_user_message() -> None:
    history = [user("1"), answer("1"), user("2"), answer("2"), user("3"), answer("3")]
    assert budget_history(one_token, 5)(history) == history[2:]


def test_budget_uses_the_counter() -> None:
    history = [user("x" * 10), answer("x" * 10), user("y"), answer("y")]

    def by_length(message: Message) -> int:
        return len(message.content)

    assert budget_history(by_length, 19)(history) == history[2:]
    assert budget_history(by_length, 22)(history) == history


def test_budget_skips_tool_results_whose_call_did_not_fit() -> None:
    history = [user("1"), calls("a"), result("a"), user("2"), answer()]
    assert budget_history(one_token, 3)(history) == [user("2"), answer()]


def test_budget_raises_history_error_when_nothing_usable_fits() -> None:
    history = [user(), calls("a"), result("a")]
    with pytest.raises(HistoryError, match="Raise max_tokens"):
        budget_history(one_token, 2)(history)


def test_budget_raises_history_error_when_the_newest_message_alone_is_too_big() -> None:
    with pytest.raises(HistoryError):
        budget_history(lambda _: 100, 99)([user()])


def test_budget_counts_each_message_at_most_once() -> None:
    seen: list[Message] = []

    def counting(message: Message) -> int:
        seen.append(message)
        return 1

    history = [user(str(i)) for i in range(10)]
    budget_history(counting, 100)(history)
    assert len(seen) == 10


def test_budget_without_a_counter_uses_approximate_tokens() -> None:
    history = [user("a" * 400), user("b")]
    assert budget_history(None, approximate_tokens(history[1]))(history) == [history[1]]


# --- counters --------------------------------------------------------------------------


def test_approximate_tokens_is_a_quarter_of_the_json_length_rounded_up() -> None:
    message = user("x" * 101)
    expected = math.ceil(len(message.model_dump_json(exclude_defaults=True)) / 4)
    assert approximate_tokens(message) == expected


def test_approximate_tokens_is_at_least_one() -> None:
    assert approximate_tokens(Message(role="user")) >= 1


def test_approximate_tokens_counts_text_that_is_not_valid_unicode() -> None:
    assert approximate_tokens(user("lone \udc00 surrogate")) > 1


def test_tiktoken_counter_without_tiktoken_explains_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry in sys.modules makes `import tiktoken` raise ImportError.
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    with pytest.raises(InvalidInputError, match="pip install tiktoken"):
        tiktoken_counter()


class _WordEncoding:
    """Stands in for a tiktoken encoding: one token per word."""

    def encode(self, text: str, disallowed_special: object = "all") -> list[str]:
        assert disallowed_special == ()
        return text.split()


@pytest.fixture
def word_tiktoken(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("tiktoken")

    def get_encoding(name: str) -> _WordEncoding:
        if name != "words":
            raise ValueError(f"Unknown encoding {name}")
        return _WordEncoding()

    fake.get_encoding = get_encoding  # type: ignore[attr-defined]
    fake.list_encoding_names = lambda: ["words"]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tiktoken", fake)


@pytest.mark.usefixtures("word_tiktoken")
def test_tiktoken_counter_counts_the_text_the_model_reads_plus_a_fixed_overhead() -> None:
    count = tiktoken_counter("words")
    message = Message(
        role="user",
        content="two words",
        parts=[TextPart(text="three more words"), UrlPart(url="https://x")],
    )
    # overhead 3 + role 1 + content 2 + text part 3 + url 1
    assert count(message) == 10
    call = Message(role="assistant", tool_calls=[ToolCall(id="a", name="f", arguments="{}")])
    assert count(call) == 3 + 1 + 0 + 2


@pytest.mark.usefixtures("word_tiktoken")
def test_tiktoken_counter_estimates_parts_without_text() -> None:
    count = tiktoken_counter("words")
    data = DataPart(media_type="image/png", data="A" * 400)
    assert count(Message(role="user", parts=[data])) > 100


@pytest.mark.usefixtures("word_tiktoken")
def test_tiktoken_counter_rejects_an_unknown_encoding() -> None:
    with pytest.raises(InvalidInputError, match="Pass one of words"):
        tiktoken_counter("nope")


def test_tiktoken_counter_counts_more_tokens_for_longer_text() -> None:
    pytest.importorskip("tiktoken")
    try:
        count = tiktoken_counter("cl100k_base")
    except (InvalidInputError, OSError):
        pytest.skip("the tiktoken encoding file cannot be loaded here (offline?)")
    assert count(user("hello " * 50)) > count(user("hello")) > 0
