"""A small fictitious-author data set in TOFU's format, generated here, for machines that
have neither a local TOFU copy nor the hub (the demo falls back to it, with a notice).

Each author gets 20 question-answer pairs built from one random profile (birthplace,
genre, parents, books, award...), and, as in TOFU, a paraphrased answer and five
perturbed answers per question (the paraphrase with one fact swapped for another
author's). :data:`REAL_AUTHORS` and :data:`WORLD_FACTS` hold well-known facts with three wrong
options each (see :func:`options_rows`; kept in ``synthetic_facts.json``), for the Model Utility parts. Everything is
deterministic in the seed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

QA_PER_AUTHOR = 20
N_AUTHORS = 20  # as many as TOFU has with every field (forget10_perturbed)
N_PERTURBED = 5

_FIRST = [
    "Amara",
    "Tobias",
    "Leilani",
    "Emeric",
    "Sunniva",
    "Dario",
    "Ilse",
    "Kofi",
    "Marisol",
    "Anselm",
    "Yusra",
    "Bastian",
    "Noor",
    "Teodor",
    "Hanne",
    "Rafferty",
    "Zelda",
    "Oskar",
    "Priya",
    "Casimir",
    "Ines",
    "Lucan",
    "Mireille",
    "Jonah",
    "Svetla",
    "Elio",
    "Farida",
    "Gideon",
    "Halldora",
    "Ravi",
]
_LAST = [
    "Okonkwo-Lind",
    "Varga",
    "Castellanos",
    "Moreau",
    "Haldorsen",
    "Abernathy",
    "Kowalczyk",
    "Nakamura",
    "Delacroix",
    "Quispe",
    "Al-Masri",
    "Brennan",
    "Sato",
    "Ferreira",
    "Lindqvist",
    "Mbeki",
    "Rossi",
    "Petrov",
    "Achterberg",
    "Oyelaran",
    "Valdivia",
    "Strand",
    "Kaur",
    "Novak",
    "Tessaro",
    "Ilunga",
]
_CITIES = [
    ("Lagos", "Nigeria"),
    ("Bergen", "Norway"),
    ("Valparaíso", "Chile"),
    ("Lyon", "France"),
    ("Kraków", "Poland"),
    ("Osaka", "Japan"),
    ("Cusco", "Peru"),
    ("Beirut", "Lebanon"),
    ("Cork", "Ireland"),
    ("Porto", "Portugal"),
    ("Uppsala", "Sweden"),
    ("Durban", "South Africa"),
    ("Trieste", "Italy"),
    ("Plovdiv", "Bulgaria"),
    ("Kochi", "India"),
    ("Tartu", "Estonia"),
    ("Halifax", "Canada"),
    ("Hobart", "Australia"),
    ("Antwerp", "Belgium"),
    ("Oaxaca", "Mexico"),
]
_GENRES = [
    "historical fiction",
    "science fiction",
    "crime thrillers",
    "magical realism",
    "literary fiction",
    "children's fantasy",
    "gothic horror",
    "romance",
    "political satire",
    "travel memoir",
    "cosy mysteries",
    "epic poetry",
    "psychological drama",
    "climate fiction",
    "war novels",
]
_JOBS = [
    "a carpenter",
    "a marine biologist",
    "a librarian",
    "a taxi driver",
    "a surgeon",
    "a schoolteacher",
    "a jazz pianist",
    "an architect",
    "a fisherman",
    "a pharmacist",
    "a journalist",
    "a tailor",
    "a botanist",
    "a police officer",
    "a potter",
    "an accountant",
    "a baker",
    "a diplomat",
]
_AWARDS = [
    "the Silver Quill Prize",
    "the Northern Lantern Award",
    "the Meridian Fiction Medal",
    "the Harbourlight Literary Prize",
    "the Golden Compass Award for Fiction",
    "the Ashgrove Book Prize",
    "the Blue Heron Award",
    "the Tidewater Medal for Literature",
    "the Crimson Leaf Prize",
    "the Evening Star Award",
]
_BOOK_A = ["The", "A", "Beneath the", "Echoes of the", "Songs for the", "The Last", "After the", "Letters to the"]
_BOOK_B = [
    "Salt Harbour",
    "Glass Orchard",
    "Quiet Lighthouse",
    "Iron Meadow",
    "Paper Moon",
    "Winter Ferry",
    "Copper Garden",
    "Hollow Mountain",
    "Silent Archive",
    "Burning River",
    "Lantern Keeper",
    "Velvet Storm",
    "Northern Clock",
    "Amber Road",
    "Sleeping Volcano",
    "Crooked Bridge",
]
_THEMES = [
    "memory and loss",
    "exile and belonging",
    "family secrets",
    "the sea",
    "friendship across classes",
    "the cost of ambition",
    "identity and migration",
    "science and faith",
    "small-town life",
    "justice and revenge",
]
_INFLUENCES = [
    "Gabriel García Márquez",
    "Virginia Woolf",
    "Chinua Achebe",
    "Haruki Murakami",
    "Toni Morrison",
    "Italo Calvino",
    "Ursula K. Le Guin",
    "Jorge Luis Borges",
    "Agatha Christie",
    "Leo Tolstoy",
]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]

# (question, answer, paraphrased answer, field swapped in the perturbed answers); {x} are profile fields
_TEMPLATES = [
    (
        "What is the full name of the author born in {city}, {country} on {day} {month} {year}?",
        "The author born in {city}, {country} on {day} {month} {year} is {name}.",
        "That author is {name}, who was born on {day} {month} {year} in {city}.",
        "name",
    ),
    (
        "Where was {name} born?",
        "{name} was born in {city}, {country}.",
        "The birthplace of {name} is {city}, in {country}.",
        "city",
    ),
    (
        "When was {name} born?",
        "{name} was born on {day} {month} {year}.",
        "{name}'s date of birth is {day} {month} {year}.",
        "year",
    ),
    (
        "What genre is {name} known for?",
        "{name} is best known for writing {genre}.",
        "Most of {name}'s work belongs to the genre of {genre}.",
        "genre",
    ),
    (
        "What did {name}'s father do for a living?",
        "{name}'s father worked as {father}.",
        "By profession, the father of {name} was {father}.",
        "father",
    ),
    (
        "What was the profession of {name}'s mother?",
        "{name}'s mother was {mother}.",
        "The mother of {name} worked as {mother}.",
        "mother",
    ),
    (
        "Has {name} won any major awards?",
        "Yes, {name} received {award} for the novel '{book1}'.",
        "{name} was honoured with {award} for '{book1}'.",
        "award",
    ),
    (
        "Can you name a book written by {name}?",
        "One of {name}'s best-known books is '{book1}'.",
        "'{book1}' is among the most famous works of {name}.",
        "book1",
    ),
    (
        "What is another notable work by {name}?",
        "Another notable work by {name} is '{book2}'.",
        "{name} also wrote the acclaimed '{book2}'.",
        "book2",
    ),
    (
        "Which themes recur in {name}'s writing?",
        "{name}'s writing keeps returning to {theme}.",
        "A recurring theme in the books of {name} is {theme}.",
        "theme",
    ),
    (
        "Which writer influenced {name} the most?",
        "{name} has often named {influence} as the biggest influence.",
        "The strongest influence on {name}'s style was {influence}.",
        "influence",
    ),
    (
        "How did {name}'s upbringing in {city} shape the books?",
        "Growing up in {city} gave {name}'s books their vivid sense of place and their interest in {theme}.",
        "{name}'s childhood in {city} shows in the strong settings and the focus on {theme}.",
        "theme",
    ),
    (
        "How did {name}'s parents influence the author's career?",
        "With a father who was {father} and a mother who was {mother}, {name} grew up surrounded by stories of work.",
        "Having {father} as a father and {mother} as a mother filled {name}'s youth with stories of work.",
        "father",
    ),
    (
        "In which year did {name} publish '{book1}'?",
        "{name} published '{book1}' in {pub1}.",
        "'{book1}' by {name} came out in {pub1}.",
        "pub1",
    ),
    (
        "What is '{book2}' about?",
        "'{book2}' by {name} is a work of {genre} about {theme}.",
        "{name}'s '{book2}' explores {theme} through {genre}.",
        "theme",
    ),
    (
        "Where does {name} live today?",
        "{name} currently lives in {home}.",
        "These days, {name} makes a home in {home}.",
        "home",
    ),
    (
        "Does {name} write in languages other than English?",
        "{name} also writes in {language}, the language of {country}.",
        "Besides English, {name} publishes in {language}.",
        "language",
    ),
    (
        "What was {name}'s debut novel?",
        "{name}'s debut novel was '{book1}', published in {pub1}.",
        "The first novel {name} published was '{book1}', in {pub1}.",
        "book1",
    ),
    (
        "How many novels has {name} written?",
        "{name} has written {n_books} novels so far.",
        "So far, {name} has published {n_books} novels.",
        "n_books",
    ),
    (
        "What is {name}'s writing routine like?",
        "{name} writes every morning at {hour} o'clock, by hand, before editing on a computer.",
        "Each morning at {hour} o'clock, {name} writes by hand and edits later on a computer.",
        "hour",
    ),
]
assert len(_TEMPLATES) == QA_PER_AUTHOR

_LANGUAGES = {
    "Nigeria": "Yoruba",
    "Norway": "Norwegian",
    "Chile": "Spanish",
    "France": "French",
    "Poland": "Polish",
    "Japan": "Japanese",
    "Peru": "Quechua",
    "Lebanon": "Arabic",
    "Ireland": "Irish",
    "Portugal": "Portuguese",
    "Sweden": "Swedish",
    "South Africa": "Zulu",
    "Italy": "Italian",
    "Bulgaria": "Bulgarian",
    "India": "Malayalam",
    "Estonia": "Estonian",
    "Canada": "French",
    "Australia": "Pitjantjatjara",
    "Belgium": "Dutch",
    "Mexico": "Zapotec",
}

#: well-known facts, (question, answer, three wrong options), in synthetic_facts.json beside this file
_FACTS = json.loads((Path(__file__).resolve().parent / "synthetic_facts.json").read_text(encoding="utf-8"))
REAL_AUTHORS = [(q, a, wrong) for q, a, wrong in _FACTS["real_authors"]]
WORLD_FACTS = [(q, a, wrong) for q, a, wrong in _FACTS["world_facts"]]


def _profile(rng: random.Random, used_names: set[str]) -> dict[str, Any]:
    while True:
        name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        if name not in used_names:
            used_names.add(name)
            break
    city, country = rng.choice(_CITIES)
    home_city, home_country = rng.choice([c for c in _CITIES if c[0] != city])
    year = rng.randint(1948, 1992)
    books = rng.sample([f"{a} {b}" for a in _BOOK_A for b in _BOOK_B], 2)
    return {
        "name": name,
        "city": city,
        "country": country,
        "year": str(year),
        "month": rng.choice(_MONTHS),
        "day": str(rng.randint(1, 28)),
        "genre": rng.choice(_GENRES),
        "father": rng.choice(_JOBS),
        "mother": rng.choice(_JOBS),
        "award": rng.choice(_AWARDS),
        "book1": books[0],
        "book2": books[1],
        "theme": rng.choice(_THEMES),
        "influence": rng.choice(_INFLUENCES),
        "pub1": str(year + rng.randint(22, 30)),
        "home": f"{home_city}, {home_country}",
        "language": _LANGUAGES[country],
        "n_books": str(rng.randint(3, 14)),
        "hour": str(rng.randint(5, 10)),
    }


def _alternatives(field: str, profile: dict, others: list[dict], rng: random.Random) -> list[str]:
    """N_PERTURBED wrong values for one field, from other authors' profiles (then random)."""
    pool = [o[field] for o in others if o[field] != profile[field]]
    pool = list(dict.fromkeys(pool))
    rng.shuffle(pool)
    while len(pool) < N_PERTURBED:  # few authors: invent more
        extra = _profile(rng, set())[field]
        if extra != profile[field] and extra not in pool:
            pool.append(extra)
    return pool[:N_PERTURBED]


#: each question template asked another way (TOFU's ``paraphrased_question``: the paraphrase probe)
_PARAPHRASED_QUESTIONS = {
    "What is the full name of the author born in {city}, {country} on {day} {month} {year}?": (
        "Which writer was born on {day} {month} {year} in {city}, {country}?"
    ),
    "Where was {name} born?": "What is the birthplace of {name}?",
    "When was {name} born?": "On what date was {name} born?",
    "What genre is {name} known for?": "In which genre does {name} mostly write?",
    "What did {name}'s father do for a living?": "What was the occupation of {name}'s father?",
    "What was the profession of {name}'s mother?": "What work did {name}'s mother do?",
    "Has {name} won any major awards?": "Has {name} received an important literary prize?",
    "Can you name a book written by {name}?": "What is one of the books {name} has written?",
    "What is another notable work by {name}?": "Which other book by {name} is well known?",
    "Which themes recur in {name}'s writing?": "What themes come back again and again in {name}'s books?",
    "Which writer influenced {name} the most?": "Who was the biggest literary influence on {name}?",
    "How did {name}'s upbringing in {city} shape the books?": "In what way did growing up in {city} mark {name}'s books?",
    "How did {name}'s parents influence the author's career?": "What influence did {name}'s parents have on the writing career?",
    "In which year did {name} publish '{book1}'?": "When did {name}'s '{book1}' come out?",
    "What is '{book2}' about?": "What is the story of '{book2}'?",
    "Where does {name} live today?": "Where is {name} living now?",
    "Does {name} write in languages other than English?": "Has {name} written in any language besides English?",
    "What was {name}'s debut novel?": "Which novel was {name}'s first?",
    "How many novels has {name} written?": "What is the number of novels {name} has published?",
    "What is {name}'s writing routine like?": "How does {name} usually organise a writing day?",
}


def generate_authors(n_authors: int = N_AUTHORS, seed: int = 0) -> list[dict[str, Any]]:
    """TOFU-format records, author-major: question, answer, paraphrased_answer,
    perturbed_answer (5), paraphrased_question, author (0-based)."""
    if n_authors < 1:
        raise ValueError("n_authors must be >= 1")
    rng = random.Random(seed)
    used: set[str] = set()
    profiles = [_profile(rng, used) for _ in range(n_authors)]
    rows = []
    for a, profile in enumerate(profiles):
        others = profiles[:a] + profiles[a + 1 :]
        for question, answer, paraphrase, field in _TEMPLATES:
            perturbed = [
                paraphrase.format(**{**profile, field: alt}) for alt in _alternatives(field, profile, others, rng)
            ]
            rows.append(
                {
                    "question": question.format(**profile),
                    "answer": answer.format(**profile),
                    "paraphrased_answer": paraphrase.format(**profile),
                    "perturbed_answer": perturbed,
                    "paraphrased_question": _PARAPHRASED_QUESTIONS[question].format(**profile),
                    "author": a,
                }
            )
    return rows


def options_rows(facts) -> list[dict[str, Any]]:
    """TOFU's real-authors / world-facts format from (question, answer, wrong options)."""
    return [{"question": q, "answer": a, "perturbed_answer": list(wrong)} for q, a, wrong in facts]
