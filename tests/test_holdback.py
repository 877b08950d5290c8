"""Text held back with its tokens while it could begin a stop string (protocols/stop_strings.py)."""

from __future__ import annotations

import math

from protocols.events import Delta, TokenInfo
from protocols.stop_strings import Holdback, StopStrings, described, stop_string_of

# A stand-in tokenizer of its own words: one token per character, ids from 100 on.


def retokenize(text: str) -> list[TokenInfo]:
    return [TokenInfo(100 + ord(c), c, math.nan) for c in text]


def piece(text: str, token_id: int) -> Delta:
    return Delta(0, text, [token_id], [TokenInfo(token_id, text, -0.5)])


def pushed(holdback: Holdback, *pieces: Delta) -> list[Delta]:
    return [out for p in pieces if (out := holdback.push(p)) is not None]


def test_text_that_cannot_begin_a_stop_string_goes_out_at_once_with_its_tokens() -> None:
    holdback = Holdback()
    holdback.begin(["THE END"], keep_stop=False, retokenize=retokenize)
    out = pushed(holdback, piece("In", 1), piece(" the", 2), piece(" sleepy", 3))
    assert [(d.text, d.token_ids) for d in out] == [("In", [1]), (" the", [2]), (" sleepy", [3])]
    assert [t.token_id for d in out for t in d.tokens or ()] == [1, 2, 3]


def test_a_possible_start_of_a_stop_string_is_held_with_its_tokens_until_it_is_not() -> None:
    holdback = Holdback()
    holdback.begin([" sleepy cat"], keep_stop=False, retokenize=retokenize)
    assert pushed(holdback, piece("In", 1), piece(" the", 2)) == [piece("In", 1), piece(" the", 2)]
    assert holdback.push(piece(" sleepy", 3)) is None
    assert holdback.held_ids == [3]
    out = holdback.push(piece(" town", 4))
    assert out is not None and (out.text, out.token_ids) == (" sleepy town", [3, 4])
    assert [t.token_id for t in out.tokens or ()] == [3, 4]
    assert holdback.held_ids == []


def test_the_end_drops_the_stop_string_and_its_tokens_unless_it_is_kept() -> None:
    # " THE" is split by the stop string: what is left of it (" ") gets its own token.
    for keep, expected in ((False, (" ", [100 + ord(" ")])), (True, (" THE END", [2, 3]))):
        holdback = Holdback()
        holdback.begin(["THE END"], keep_stop=keep, retokenize=retokenize)
        assert holdback.push(piece(" once", 1)) == piece(" once", 1)
        assert holdback.push(piece(" THE", 2)) is None
        last = holdback.finish(Delta(0, " END", [3], None, "stop"), "THE END")
        assert (last.text, last.token_ids, last.finish_reason) == (*expected, "stop")


def test_tokens_wholly_before_a_stop_string_keep_their_log_probabilities() -> None:
    holdback = Holdback()
    holdback.begin([" END"], keep_stop=False, retokenize=retokenize)
    assert holdback.push(piece(" the", 1)) == piece(" the", 1)
    merged = Delta(0, " one END", [2, 3], [TokenInfo(2, " one", -0.1), TokenInfo(3, " END", -0.2)])
    last = holdback.finish(merged, " END")
    assert (last.text, last.token_ids) == (" one", [2])
    assert last.tokens == [TokenInfo(2, " one", -0.1)]


def test_a_token_that_runs_past_the_stop_string_is_split_too() -> None:
    # The stop string "\n" inside the token "\n\n": the engine's text ends at the stop string.
    holdback = Holdback()
    holdback.begin(["\n"], keep_stop=True, retokenize=retokenize)
    last = holdback.finish(Delta(0, "\n", [7], None, "stop"), "\n", beyond="\n")
    assert (last.text, last.token_ids) == ("\n", [100 + ord("\n")])


def test_described_text_gets_fresh_tokens_with_no_log_probability() -> None:
    pieces = [piece("ab", 1), piece("cd", 2)]
    out = described(pieces, "abc", retokenize)
    assert (out.text, out.token_ids) == ("abc", [1, 100 + ord("c")])
    assert out.tokens is not None and math.isnan(out.tokens[-1].logprob)


def test_a_character_split_over_tokens_goes_out_whole() -> None:
    holdback = Holdback()
    holdback.begin([], keep_stop=False, retokenize=retokenize)
    assert holdback.push(piece("", 1)) is None  # the first bytes of a character: no text yet
    out = holdback.push(piece("🐱", 2))
    assert out is not None and (out.text, out.token_ids) == ("🐱", [1, 2])


def test_a_stop_string_that_spans_two_engine_requests_ends_the_generation() -> None:
    holdback = Holdback()
    holdback.begin([" sleepy town"], keep_stop=False, retokenize=retokenize)
    assert pushed(holdback, piece(" the", 1), piece(" sleepy", 2)) == [piece(" the", 1)]
    # The request ends here (a pause); the next one continues the sequence.
    holdback.begin([" sleepy town"], keep_stop=False, retokenize=retokenize)
    last = holdback.push(piece(" town", 3))
    assert holdback.stopped_at == " sleepy town"
    assert last is not None
    assert (last.text, last.token_ids, last.finish_reason) == ("", [], "stop")


def test_an_end_token_with_no_text_keeps_its_id() -> None:
    holdback = Holdback()
    holdback.begin([], keep_stop=False, retokenize=retokenize)
    last = holdback.finish(Delta(0, "", [2], None, "stop"), None)
    assert (last.text, last.token_ids, last.finish_reason) == ("", [2], "stop")


def spell(token_id: int) -> str:
    return chr(token_id - 100)


def test_a_whole_answer_cut_at_a_stop_string_keeps_the_tokens_of_its_text() -> None:
    stops = StopStrings(["c"], False, spell, retokenize)
    tokens = [TokenInfo(100 + ord(c), c, -0.5) for c in "abcd"]
    cut = stops.cut("ab", "c", [t.token_id for t in tokens], tokens)
    assert cut is not None and cut.text == "ab" and cut.tokens == tokens[:2]
    assert stops.cut("ab", 7, [], None) is None  # a stop token ended it: nothing to cut
    assert stops.beyond("ab", "c", [t.token_id for t in tokens], None) == "cd"
    assert stops.beyond("ab", None, [], None) == ""


def test_the_engine_keeps_stop_strings_only_where_the_client_did_not_ask() -> None:
    assert StopStrings(["c"], False, spell, retokenize).kept_by_engine
    assert not StopStrings(["c"], True, spell, retokenize).kept_by_engine
    assert not StopStrings([], False, spell, retokenize).kept_by_engine
    kept = StopStrings(["c"], False, spell, retokenize)
    assert kept.streamed_text("ab!", True, [100 + ord("!")]) == "ab"  # an end token's text
    assert kept.streamed_text("ab!", False, [100 + ord("!")]) == "ab!"
    assert stop_string_of("c") == "c" and stop_string_of(2) is None
