"""Which of two things came first, by the years the texts read give them (drvenus.small.compare)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drvenus.small import compare
from drvenus.small.levers import EMBEDDED_LEVERS

# search results as the agent reads them: a title line, then the snippet
RESULTS = (
    "Scott Derrickson\n"
    "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer.\n"
    "Ed Wood (film)\n"
    "Ed Wood is a 1994 American biographical period comedy-drama film directed by Tim Burton.\n"
    "Battle of Guam (1944)\n"
    "The Second Battle of Guam (21 July – 10 August 1944) was the American recapture of Guam, "
    "captured by the Japanese in the 1941 First Battle of Guam.\n"
    "Virginia Woolf\n"
    "Adeline Virginia Woolf (25 January 1882 – 28 March 1941) was an English writer.\n"
    "Emma Bull\n"
    "Emma Bull (born December 13, 1954) is an American science fiction and fantasy author.\n"
    "Ptolemaic Kingdom\n"
    "The Ptolemaic Kingdom was a Hellenistic state founded in 305 BC by Ptolemy I Soter.\n"
    "San Marino\n"
    "San Marino is one of the world's oldest republics, founded on 3 September 301 AD.\n"
)


def parts() -> list[str]:
    from drvenus.small.neural import passages

    return [p for _, _, p in passages([RESULTS])]


@pytest.mark.parametrize(("question", "order"), [
    ("Who was born first, Erika Jayne or Marco Da Silva", "early"),
    ("Which band formed earlier, Lit or Adorable?", "early"),
    ("Who is older, Ferdi Taygan or Mahesh Bhupathi?", "early"),
    ("Which film was created more recently, Koyaanisqatsi or Mad Hot Ballroom?", "late"),
    ("who is younger Ulrich Walter or Luca Parmitano?", "late"),
    ("Which film is newer, The Apple Dumpling Gang or Heavyweights?", "late"),
    # a superlative about one thing, or no order at all
    ("Who was the first Russian composer to be known abroad, Scarlatti or Tchaikovsky?", None),
    ("Which river is longer, the Ural or the Krishna?", None),  # an amount, not an order
    ("Who was born first and who died later, A or B?", None),
])
def test_the_order_a_question_asks(question: str, order: str | None) -> None:
    assert compare.order_asked(question) == order


def test_the_passage_of_a_choice_is_the_result_titled_with_its_name() -> None:
    found = parts()
    assert compare.choice_passage("Ed Wood", found).startswith("Ed Wood (film)\n")
    assert compare.choice_passage("the Battle of Guam", found).startswith("Battle of Guam")
    assert compare.choice_passage("San Marino's", found).startswith("San Marino\n")
    assert compare.choice_passage("Erika Jayne", found) is None
    assert compare.choice_passage("Woo", found) is None  # whole words only
    # a title of one word held in a longer name is another thing; of two words, the thing
    manila = [*found, "Manila\nManila is the capital of the Philippines, founded in 1571."]
    assert compare.choice_passage("the Battle of Manila", manila) is None
    assert compare.choice_passage("Lady Emma Bull", found).startswith("Emma Bull\n")
    assert compare.choice_passage("", found) is None


def test_the_year_a_passage_gives() -> None:
    found = parts()

    def year(choice: str, question: str = "Which came first?") -> int | None:
        return compare.passage_year(compare.choice_passage(choice, found) or "", question)

    assert year("Scott Derrickson") == 1966
    assert year("Ed Wood") == 1994
    assert year("Battle of Guam") == 1944  # the title's year, not the 1941 battle named after it
    assert year("Virginia Woolf") == 1882
    assert year("Virginia Woolf", "Who died first, Virginia Woolf or Emma Bull?") == 1941
    assert year("Emma Bull", "Who died first, Virginia Woolf or Emma Bull?") is None
    assert year("Ptolemaic Kingdom") == -305
    assert year("San Marino") == 301
    assert compare.passage_year("A title\nno year here at all", "Which came first?") is None


@pytest.mark.parametrize(("question", "chosen"), [
    ("Who was born earlier, Emma Bull or Virginia Woolf?", "Virginia Woolf"),
    ("Who was born more recently, Emma Bull or Virginia Woolf?", "Emma Bull"),
    ("Who died first, Emma Bull or Virginia Woolf?", None),  # no year of death for Emma Bull
    ("Which was founded first, the Ptolemaic Kingdom or San Marino?", "the Ptolemaic Kingdom"),
    ("Which came out first, Ed Wood or Scott Derrickson?", "Scott Derrickson"),
    ("Which came out first, Ed Wood or Plan 9?", None),  # nothing read about Plan 9
    ("Which is longer, Ed Wood or Scott Derrickson?", None),  # no length read
    ("Which is better, Ed Wood or Scott Derrickson?", None),  # nothing the texts state
])
def test_the_choice_the_years_make(question: str, chosen: str | None) -> None:
    from drvenus.small.spans import answer_shape

    choices = answer_shape(question).choices
    assert len(choices) == 2
    assert compare.choose_by_year(question, choices, parts()) == chosen


@settings(max_examples=80, deadline=None)
@given(st.integers(-500, 2099), st.integers(-500, 2099), st.booleans())
def test_the_earlier_year_wins_whichever_way_the_choices_are_named(
        a: int, b: int, early: bool) -> None:
    def written(year: int) -> str:
        return f"{-year} BC" if year < 0 else f"AD {year}" if year < 1000 else str(year)

    texts = [f"Alpha\nAlpha was made in {written(a)} by someone.\n"
             f"Beta\nBeta was made in {written(b)} by someone else."]
    from drvenus.small.neural import passages

    found = [p for _, _, p in passages(texts)]
    asked = "first" if early else "more recently"
    one = compare.choose_by_year(f"Which was made {asked}, Alpha or Beta?", ("Alpha", "Beta"),
                                 found)
    other = compare.choose_by_year(f"Which was made {asked}, Beta or Alpha?", ("Beta", "Alpha"),
                                   found)
    assert one == other
    if a == b:
        assert one is None
    else:
        assert one == (("Alpha" if a < b else "Beta") if early else ("Alpha" if a > b else "Beta"))


def test_the_answer_turn_admits_only_the_choice_the_years_make() -> None:
    """Under the preset's levers the real span grammar of a which-came-first question offers
    only the choice the years read make; without the lever, or without years, both stay."""
    from drvenus.protocol.grammar import protocol_grammar
    from drvenus.small import grammar

    assert EMBEDDED_LEVERS.choice_compare
    question = "Who was born earlier, Emma Bull or Virginia Woolf?"
    options = grammar.answer_options([RESULTS], question, EMBEDDED_LEVERS)
    assert options == {"answer_choices": ("Virginia Woolf",)}
    text = protocol_grammar(False, allow_tool_call=False, allow_answer=True, **options)
    assert "Virginia Woolf" in text and "Emma Bull" not in text
    off = EMBEDDED_LEVERS.but(choice_compare=False)
    assert grammar.answer_options([RESULTS], question, off) == {
        "answer_choices": ("Emma Bull", "Virginia Woolf")}
    assert grammar.answer_options(["Nothing\nabout either."], question, EMBEDDED_LEVERS) == {
        "answer_choices": ("Emma Bull", "Virginia Woolf")}


def test_the_choice_no_year_was_read_for_is_searched_for() -> None:
    found = parts()
    question = "Whose reign began first, Maria Theresa's or Virginia Woolf's?"
    assert compare.missing_choice(question, ("Maria Theresa's", "Virginia Woolf's"),
                                  found) == "Maria Theresa"
    assert compare.missing_choice("Who was born first, Emma Bull or Virginia Woolf?",
                                  ("Emma Bull", "Virginia Woolf"), found) is None
    assert compare.missing_choice("Which is better, Plan 9 or Ed Wood?", ("Plan 9", "Ed Wood"),
                                  found) is None  # nothing the texts state is compared
    assert compare.missing_choice("Which is longer, Plan 9 or Ed Wood?", ("Plan 9", "Ed Wood"),
                                  found) == "Plan 9"  # a length: none read for either


def test_the_second_search_of_a_which_came_first_question_asks_for_the_missing_choice() -> None:
    """Under the preset, after a first search that read no year for one choice, the next turn's
    real grammar is a search for that choice's name alone; with both years read, it answers."""
    from drvenus.protocol.state import TurnState
    from drvenus.small import grammar

    def state(question: str) -> TurnState:
        call = ('<think>\n\n</think>\n<tool_call>\n'
                '{"name": "search", "arguments": {"query": ["q"]}}\n</tool_call>')
        body = json.dumps([{"query": "q", "web_page_info_list": [
            {"title": t, "url": f"https://en.wikipedia.org/wiki/{i}", "snippet": s}
            for i, (t, s) in enumerate(zip(RESULTS.splitlines()[::2],
                                           RESULTS.splitlines()[1::2], strict=True))]}])
        return TurnState.of([{"role": "user", "content": question},
                             {"role": "assistant", "content": call},
                             {"role": "user", "content": f"<tool_response>\n{body}\n"
                                                          "</tool_response>"}])

    asked = state("Who was born first, Maria Theresa or Emma Bull?")
    assert grammar.second_search(asked, EMBEDDED_LEVERS) == "Maria Theresa"
    text = grammar.turn_grammar("any", asked, EMBEDDED_LEVERS)
    assert "Maria Theresa" in text and "Emma Bull" not in text  # a search, no answer yet
    assert grammar.second_search(asked, EMBEDDED_LEVERS.but(choice_compare=False)) is None
    both = state("Who was born first, Virginia Woolf or Emma Bull?")
    assert grammar.second_search(both, EMBEDDED_LEVERS) is None


AMOUNTS = (
    "Lahore\nCapital of Punjab, Pakistan. Lahore is the second-largest city of Pakistan, with "
    "a population of 13,004,135 as of 2023.\n"
    "Chengdu\nCapital of Sichuan, China. Chengdu is home to 20.9 million inhabitants.\n"
    "Belgium\nCountry in Western Europe. Belgium covers an area of 30,689 km2 (11,849 sq mi) "
    "and has a population of more than 11.8 million.\n"
    "Rwanda\nCountry in Central Africa. Rwanda is 26,338 square kilometres in area, founded "
    "in 1962.\n"
    "Ural (river)\nThe Ural is a river that flows 2,428 km through Russia and Kazakhstan.\n"
    "Krishna River\nThe Krishna is a river 1,400 kilometres long; in 2001 a dam was built.\n"
    "Xanthoceras\nXanthoceras is a genus with one species, native to China.\n"
    "Ehretia\nEhretia is a genus of about 66 accepted species of flowering plants.\n"
    "Empire State Building\nThe Empire State Building is a 1,454 ft skyscraper.\n"
    "Chrysler Building\nThe Chrysler Building is 319 m tall, built in 1930.\n"
)


@pytest.mark.parametrize(("question", "measure", "chosen"), [
    ("Which city has more inhabitants, Lahore or Chengdu?", "population", "Chengdu"),
    ("Which city has fewer people, Lahore or Chengdu?", "population", "Lahore"),
    ("Which country covers a larger area, Belgium or Rwanda?", "area", "Belgium"),
    ("Which country is larger, Belgium or Rwanda?", "area", "Belgium"),
    ("Which country has the bigger population, Belgium or Rwanda?", "population", None),
    ("Which river is longer, the Ural or the Krishna?", "length", "the Ural"),
    ("Which genus has more species, Xanthoceras or Ehretia?", "count", "Ehretia"),
    ("Which building is taller, the Empire State Building or the Chrysler Building?", "height",
     "the Empire State Building"),
    ("Which magazine is published more often, Lahore or Chengdu?", None, None),
    ("Who led his country for longer, Lahore or Chengdu?", None, None),
    ("Which empire lasted longer, Lahore or Chengdu?", None, None),  # a time, not a length
])
def test_the_choice_the_amounts_make(question: str, measure: str | None,
                                     chosen: str | None) -> None:
    from drvenus.small.neural import passages
    from drvenus.small.spans import answer_shape

    asked = compare.compared(question)
    assert (asked.measure if asked else None) == measure
    found = [p for _, _, p in passages([AMOUNTS])]
    assert compare.choose(question, answer_shape(question).choices, found) == chosen


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 10**9), st.integers(1, 10**9), st.booleans(),
       st.sampled_from(["inhabitants", "km2", "km", "species"]))
def test_the_larger_amount_wins_in_any_unit_order(a: int, b: int, more: bool,
                                                   unit: str) -> None:
    from drvenus.small.neural import passages

    question = {
        "inhabitants": "Which city has {} inhabitants, Alpha or Beta?",
        "km2": "Which country is {} in area, Alpha or Beta?",
        "km": "Which river is {}, Alpha or Beta?",
        "species": "Which genus has {} species, Alpha or Beta?",
    }[unit].format({("inhabitants", True): "more", ("inhabitants", False): "fewer",
                    ("km2", True): "larger", ("km2", False): "smaller",
                    ("km", True): "longer", ("km", False): "shorter",
                    ("species", True): "more", ("species", False): "fewer"}[unit, more])
    texts = [f"Alpha\nAlpha has {a:,} {unit} by one count.\nBeta\nBeta has {b:,} {unit}."]
    found = [p for _, _, p in passages(texts)]
    chosen = compare.choose(question, ("Alpha", "Beta"), found)
    if a == b:
        assert chosen is None
    else:
        assert chosen == ("Alpha" if (a > b) == more else "Beta")
