"""Prompts for the real target, by class, each split into what training may see and what only evaluation sees.

The classes (CLASSES) are the kinds of request users send: writing (prose), code, tool-call JSON, open
conversation (chat), reasoning, math word problems, extraction, role play, science explanations and long
documents (document). Each class is a generator that fills templates with subjects; both the templates and the
subjects are split in two (`_Pool`: "train" and "eval"), so an evaluation prompt shares neither its wording nor
its subject with anything training sees. The other sources split the same way, by source:

- human conversations (`chitchat_prompts`, the PyPI package chitchat-dataset, where installed): by
  conversation, a stable hash of its key;
- standard-library docstrings (the document class) and sources (tfe.train_head's text): by file, a stable
  hash of its name; the files of `long_prompts` are evaluation's;
- self-instruct (`self_instruct_requests`): requests the target writes itself from training subjects only.

Training (tfe.train_head) draws from `training_prompts`, `self_instruct_requests` and `chitchat_prompts`;
checks and measurements use `evaluation_prompts`: hand-written prompts, one per class per round, then the
generators' evaluation halves. docs/target.md ("Training data") lists the same.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import pathlib
import random
import re
import sysconfig
import zlib
from dataclasses import dataclass

CLASSES = ("prose", "code", "tool", "chat", "reasoning", "math", "extraction", "roleplay", "science", "document")
SPLITS = ("train", "eval")
EVAL_PER_CLASS = 3  # evaluation prompts of each class: one hand-written, the rest from the evaluation halves


@dataclass(frozen=True)
class Prompt:
    cls: str
    text: str
    # Earlier turns of a conversation, as (role, text) pairs, "user" first; the text is the last user turn.
    history: tuple[tuple[str, str], ...] = ()


def held_out(key: str, every: int = 5) -> bool:
    """Whether a source (a file name, a conversation key) belongs to evaluation: one in `every`, by a hash
    that is the same on every machine and Python."""
    return zlib.crc32(key.encode()) % every == 0


class _Pool:
    """Items of one kind, split: every fourth (from the fourth) goes to evaluation."""

    def __init__(self, *items):
        self.train = [x for i, x in enumerate(items) if i % 4 != 3]
        self.eval = [x for i, x in enumerate(items) if i % 4 == 3]

    def pick(self, rng: random.Random, split: str):
        return rng.choice(self.train if split == "train" else self.eval)


_TOPICS = _Pool(
    "the water cycle", "how bridges carry weight", "the history of the printing press", "the history of the bicycle",
    "a lighthouse keeper's day", "how bees make honey", "the first train across a continent", "volcanoes",
    "a city at night", "how vaccines work", "the moon's phases", "a market in the morning", "glaciers",
    "the invention of paper", "how a compass works", "a long walk in the rain", "coral reefs", "photosynthesis",
    "the life of a river", "an old library", "how clocks keep time", "winter in a mountain village",
    "the migration of birds", "a bakery before dawn", "how batteries store energy", "the tides",
    "a harbor in a storm", "the first flight", "a school's last day", "deserts at night", "how maps are made",
    "a violin maker's workshop", "the silk road", "a small island", "how snow forms", "a night train",
    "the invention of the telephone", "a garden in autumn", "how rain forests work", "a busy airport",
)
_PROSE_FORMS = _Pool(
    "Write a short paragraph about {t}.", "Explain {t} to a ten-year-old.", "Write a short story about {t}.",
    "Describe {t} in three sentences.", "Write a poem about {t}.", "Give five facts about {t}.",
    "Summarize what you know about {t} in a few lines.", "Write the opening of an essay on {t}.",
    "Write a blog post introduction about {t}.", "Write a haiku about {t}.", "Write a diary entry about {t}.",
    "Write a product description inspired by {t}.",
)
_TASKS = _Pool(
    ("reverse a string", "s"), ("check whether a number is prime", "n"), ("compute the factorial of n", "n"),
    ("compute Fibonacci numbers", "n"), ("merge two sorted lists", "a, b"), ("count the words in a text", "text"),
    ("flatten a nested list", "xs"), ("find the maximum of a list without max()", "xs"),
    ("remove duplicates from a list keeping order", "xs"), ("parse a date string 'YYYY-MM-DD'", "s"),
    ("compute the mean and the median of a list", "xs"), ("convert Celsius to Fahrenheit", "c"),
    ("check whether a string is a palindrome", "s"), ("implement binary search", "xs, x"),
    ("read a CSV file and sum one column", "path, column"), ("compute the GCD of two numbers", "a, b"),
    ("count how often each letter occurs", "text"), ("rotate a list by k places", "xs, k"),
    ("transpose a matrix", "m"), ("validate an e-mail address", "s"), ("implement a stack", "items"),
    ("sort a list of dictionaries by a key", "rows, key"), ("find the longest common prefix", "words"),
    ("convert a number to Roman numerals", "n"),
)
_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Rust", "Go", "bash", "TypeScript", "Java"]
_CODE_FORMS = _Pool(
    "Write a {lang} function to {task}.", "In {lang}, how do I {task}? Show the code.",
    "Write a {lang} function `solve({args})` that should {task}, with a short docstring.",
    "Give a {lang} example that shows how to {task}, then explain it briefly.",
    "Write unit tests in {lang} for a function that should {task}.",
    "My {lang} code to {task} is slow. Show a faster version and explain why.",
    "Explain, line by line, a {lang} function that should {task}.",
    "Write a {lang} function to {task} and state its time complexity.",
)
_TOOLS = _Pool(
    ("search_flights", {"origin": "string", "destination": "string", "date": "YYYY-MM-DD"}, ["Berlin", "Madrid", "Rome"]),
    ("create_event", {"title": "string", "start": "ISO time", "minutes": "integer"}, ["standup", "review", "lunch"]),
    ("convert_currency", {"amount": "number", "from": "ISO code", "to": "ISO code"}, ["EUR", "USD", "JPY", "GBP"]),
    ("get_weather", {"city": "string", "unit": "celsius|fahrenheit"}, ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]),
    ("book_table", {"restaurant": "string", "people": "integer", "time": "HH:MM"}, ["Luigi's", "Sakura", "El Toro"]),
    ("set_reminder", {"text": "string", "at": "ISO time"}, ["dentist", "call mom", "pay rent"]),
    ("get_stock_price", {"symbol": "string"}, ["ACME", "GLOBEX", "INITECH"]),
    ("send_email", {"to": "string", "subject": "string", "body": "string"}, ["Ana", "Bo", "Chen", "Dara"]),
    ("translate_text", {"text": "string", "target_language": "string"}, ["German", "Spanish", "Japanese"]),
    ("search_web", {"query": "string", "max_results": "integer"}, ["electric cars", "sourdough", "chess openings"]),
    ("order_taxi", {"pickup": "string", "destination": "string"}, ["the station", "the airport", "downtown"]),
    ("play_music", {"artist": "string", "shuffle": "boolean"}, ["Bach", "Miles Davis", "Queen"]),
)
_TOOL_FORMS = _Pool(
    "You can call this tool: {schema}. Reply only with the JSON call for a request about {value}.",
    'Tools: [{schema}]\nUser request involving {value}. Output a JSON object {{"tool": ..., "arguments": {{...}}}}.',
    "Produce a JSON tool call to `{name}` with arguments {params} (use {value}).",
    "Given the function {schema}, write the call a user asking about {value} needs, as JSON only.",
    "You are an assistant with tools. Available: {schema}. The user says: I need help with {value}. Respond with a tool call in JSON.",
    "Return a JSON array with two calls to `{name}` ({params}): one for {value} and one of your choice.",
    "Which arguments would you pass to {schema} for {value}? Answer as a JSON object.",
    "Call `{name}` for {value}. Output: a JSON object with keys name and arguments.",
)
_CHAT = _Pool(
    "Hi! How are you today?", "What should I cook for dinner tonight?", "Can you recommend a good book?",
    "What are three good habits for learning a new language?", "I feel tired after work. Any tips?",
    "What's a fun weekend activity for a family?", "How do I start learning to play the guitar?",
    "Can you suggest a simple breakfast recipe?", "Tell me a joke about computers.",
    "What is the difference between weather and climate?", "How can I sleep better?",
    "What do you think makes a good friend?", "Give me three ideas for a birthday gift.",
    "What are good habits for studying?", "How do I politely decline an invitation?",
    "I have a job interview tomorrow. How should I prepare?", "What is your favorite season and why?",
    "How do I keep a plant alive indoors?", "What should I pack for a beach trip?",
    "Any tips for running my first 5k?",
)
_CHAT_FOLLOW = _Pool("", " Keep it short.", " Please explain step by step.", " Answer in a friendly tone.",
                     " Use a list.", " Be honest.", " I'm a beginner.", " Thanks!")
_REASONING = _Pool(
    "If all {a} are {b} and some {b} are {c}, must some {a} be {c}? Explain your reasoning.",
    "{p} is taller than {q}, and {q} is taller than {r}. Who is the shortest? Explain.",
    "A {x} costs more than a {y} but less than a {z}. Order them by price and explain how you know.",
    "Three friends, {p}, {q} and {r}, each have a different pet: a cat, a dog and a fish. {p} is allergic to fur and {q} does not own the dog. Who owns which pet?",
    "Is this argument valid? 'Every {a} is a {b}. This is a {b}. So it is a {a}.' Explain.",
    "What is the next number in the sequence {s}? Explain the pattern.",
    "You have a {x}, a {y} and a {z}, but can carry only two. Which would you take on a hike, and why?",
    "{p} says {q} is lying. {q} says {r} is lying. {r} says both are lying. Who tells the truth?",
)
_NAMES = _Pool("Alice", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kemal",
               "Lena", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera")
_THINGS = _Pool("cats", "mammals", "pets", "roses", "flowers", "plants", "cars", "vehicles", "machines",
                "violins", "instruments", "objects", "oaks", "trees", "forests", "sparrows", "birds", "animals")
_ITEMS = _Pool("map", "tent", "flashlight", "book", "bottle of water", "camera", "jacket", "knife", "rope",
               "phone", "blanket", "sandwich")
_SEQUENCES = _Pool("2, 4, 8, 16", "1, 1, 2, 3, 5, 8", "3, 6, 9, 12", "1, 4, 9, 16", "5, 10, 20, 40",
                   "2, 3, 5, 7, 11", "10, 7, 4, 1", "1, 3, 6, 10, 15")
_MATH = _Pool(
    "A baker makes {a} loaves an hour for {b} hours and sells {c}. How many loaves are left?",
    "{p} has {a} apples and gives {b} to each of {n} friends. How many apples does {p} have left?",
    "A train travels {a} km in {b} hours. What is its average speed? Show your work.",
    "A shirt costs ${a}. It is on sale for {n}0% off. What is the sale price?",
    "{p} saves ${b} a week. How many weeks until {p} has ${a}0?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "There are {a} students and each bus holds {b}. How many buses are needed?",
    "{p} reads {b} pages a day. A book has {a}0 pages. How many days does it take?",
    "A recipe needs {n} eggs for {b} people. How many eggs for {a} people?",
    "Tickets cost ${b} for adults and ${n} for children. What do {n} adults and {b} children pay?",
    "A tank holds {a}0 liters and drains {b} liters a minute. How long until it is empty?",
    "{p} is {a} years old, {n} times as old as a cousin was {b} years ago. How old is the cousin now?",
)
_EXTRACT = _Pool(
    "Extract every person's name and city from this text as a JSON list: {text}",
    "List the dates mentioned in the following text, one per line: {text}",
    "From this message, extract who is meeting whom, where and when, as JSON: {text}",
    "Give a table of the names and amounts in this text: {text}",
    "Pull out the key facts from this note as bullet points: {text}",
    "Return the names in this text, sorted alphabetically, as a JSON array: {text}",
    "What places does this text mention? Answer with a comma-separated list: {text}",
    "Turn this note into a JSON object with fields person, city, date and amount: {text}",
)
_CITIES = _Pool("Lisbon", "Nairobi", "Toronto", "Hanoi", "Krakow", "Lyon", "Quito", "Perth", "Seoul", "Dublin",
                "Bergen", "Porto", "Accra", "Denver", "Osaka", "Tunis")
_MONTHS = ["January", "March", "April", "June", "July", "September", "October", "December"]
_ROLES = _Pool(
    "a pirate captain", "a medieval innkeeper", "a detective in 1920s London", "a friendly robot",
    "a tour guide in Rome", "a wise old wizard", "a grumpy chef", "a space station commander",
    "a museum curator", "a sports coach", "a fairy-tale dragon", "a tech-support agent",
    "a travel agent", "a castle guard", "a librarian", "a game show host",
)
_ROLE_FORMS = _Pool(
    "You are {role}. A visitor asks you about {t}. Stay in character and answer.",
    "Pretend to be {role} and greet a new customer.",
    "Role-play as {role}: tell me about your day.",
    "Act as {role}. I want advice about {t}. What do you say?",
    "You are {role}. Write what you would say to someone who is lost.",
    "Play {role} and explain {t} in your own style.",
    "As {role}, describe your favorite place.",
    "Imagine you are {role}. Someone complains to you. Reply in character.",
)
_CONCEPTS = _Pool(
    "gravity", "photosynthesis", "how the heart pumps blood", "why ice floats", "how magnets work",
    "plate tectonics", "how sound travels", "what DNA does", "how rainbows form", "the greenhouse effect",
    "how airplanes fly", "why leaves change color", "how electricity flows in a circuit", "what black holes are",
    "how the immune system fights infection", "why the seasons change", "how lenses focus light",
    "what atoms are made of", "how soap cleans", "how earthquakes happen",
)
_SCIENCE_FORMS = _Pool(
    "Explain {c} in simple terms.", "How does {c} work? Give an example.", "Explain {c} to a high-school student.",
    "What would a scientist say about {c}?", "Describe {c} and why it matters.",
    "What are the common misconceptions about {c}?", "Give a short, accurate explanation of {c}.",
    "Explain {c} with an everyday analogy.",
)
_DOC_REQUESTS = _Pool(
    "Summarize this document in three sentences.", "What is the main purpose of the module described here?",
    "List the key points of this text.", "Explain this documentation to a beginner.",
    "Write two questions a reader might ask after reading this, and answer them.",
    "Rewrite this documentation as a short tutorial.", "What are the limitations mentioned in this text?",
    "Give a one-line summary of this text, then a longer one.",
)

# Hand-written evaluation prompts, one per class in CLASSES order a round: any prefix of the first round
# covers prose, code, tool calls and chat.
EVALUATION = [
    Prompt("prose", "Write a short paragraph about the history of the bicycle."),
    Prompt("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
    Prompt("tool", 'You can call this tool: {"name": "get_weather", "parameters": {"city": "string"}}. '
                   "Reply only with the JSON call for the weather in Vienna."),
    Prompt("chat", "What are three good habits for learning a new language?"),
    Prompt("reasoning", "If it rains, the street gets wet. The street is wet. Did it rain? Explain carefully."),
    Prompt("math", "A garden has 12 rows of 8 tulips. A rabbit eats 15 of them. How many tulips are left?"),
    Prompt("extraction", "Extract the company names from this sentence as a JSON array: Acme hired two engineers "
                         "from Globex, while Initech signed a deal with Umbrella Corp in May."),
    Prompt("roleplay", "You are a ship's cook on a long voyage. The crew is hungry and supplies are low. "
                       "What do you tell them?"),
    Prompt("science", "Why does a metal spoon feel colder than a wooden one at the same temperature?"),
    Prompt("document", "Summarize this text: The Post Office Protocol lets a mail client download messages "
                       "from a server. A client connects, authenticates with a user name and a password, lists "
                       "the messages waiting, retrieves some, marks others for deletion and quits; deletions "
                       "happen only when the session ends normally."),
    Prompt("prose", "Explain how a refrigerator keeps food cold."),
    Prompt("code", "Write a Python class for a stack with push, pop and peek."),
    Prompt("tool", "Produce a JSON tool call to `send_email` with arguments to, subject and body (to Maria)."),
    Prompt("chat", "Can you suggest a simple breakfast recipe?"),
]

# What the evaluation prompts are about, beyond the evaluation halves' subjects: a key in lower case that
# a text the target lists (`clean_subject`, `clean_question`) must not hold, so that none of them asks an
# evaluation prompt again in other words. Every evaluation prompt of a class about a subject holds one (test).
_EVALUATION_KEYS = (
    "bicycle", "fibonacci", "vienna", "new language", "tulip", "rabbit", "acme", "globex", "initech", "ship's cook",
    "voyage", "spoon", "post office", "refrigerator", "stack", "breakfast", "volcano", "market in the morning",
    "walk in the rain", "old library", "bakery", "first flight", "violin", "night train", "airport", "ice float",
    "dna", "leaves change", "season", "earthquake", "maximum of a list", "celsius", "fahrenheit", "gcd",
    "greatest common divisor", "e-mail address", "email address", "roman numeral", "robot", "space station",
    "tech-support", "tech support", "game show", "get_weather", "send_email", "play_music",
)


def _prose(rng, split):
    return _PROSE_FORMS.pick(rng, split).format(t=_TOPICS.pick(rng, split))


def _code(rng, split):
    task, args = _TASKS.pick(rng, split)
    return _CODE_FORMS.pick(rng, split).format(lang=rng.choice(_LANGS), task=task, args=args)


def _tool(rng, split):
    name, params, values = _TOOLS.pick(rng, split)
    schema = json.dumps({"name": name, "parameters": params})
    return _TOOL_FORMS.pick(rng, split).format(schema=schema, name=name, params=", ".join(params), value=rng.choice(values))


def _chat(rng, split):
    return _CHAT.pick(rng, split) + _CHAT_FOLLOW.pick(rng, split)


def _reasoning(rng, split):
    p, q, r = rng.sample(_NAMES.train if split == "train" else _NAMES.eval, 3)
    a, b, c = rng.sample(_THINGS.train if split == "train" else _THINGS.eval, 3)
    x, y, z = rng.sample(_ITEMS.train if split == "train" else _ITEMS.eval, 3)
    return _REASONING.pick(rng, split).format(p=p, q=q, r=r, a=a, b=b, c=c, x=x, y=y, z=z, s=_SEQUENCES.pick(rng, split))


def _math(rng, split):
    return _MATH.pick(rng, split).format(
        a=rng.randint(20, 99), b=rng.randint(2, 12), c=rng.randint(5, 19), n=rng.randint(2, 6), p=_NAMES.pick(rng, split)
    )


def _extraction(rng, split):
    names = rng.sample(_NAMES.train if split == "train" else _NAMES.eval, 3)
    cities = rng.sample(_CITIES.train if split == "train" else _CITIES.eval, 3)
    days = [f"{rng.choice(_MONTHS)} {rng.randint(1, 28)}" for _ in range(3)]
    text = (
        f"{names[0]} flew from {cities[0]} to {cities[1]} on {days[0]} and paid {rng.randint(90, 900)} euros. "
        f"{names[1]} will meet {names[2]} in {cities[2]} on {days[1]} to discuss the {rng.choice(['budget', 'project', 'wedding', 'move'])}; "
        f"the next call is on {days[2]}."
    )
    return _EXTRACT.pick(rng, split).format(text=text)


def _roleplay(rng, split):
    return _ROLE_FORMS.pick(rng, split).format(role=_ROLES.pick(rng, split), t=_TOPICS.pick(rng, split))


def _science(rng, split):
    return _SCIENCE_FORMS.pick(rng, split).format(c=_CONCEPTS.pick(rng, split))


def _document(rng, split):
    docs = stdlib_docstrings(split)
    text = rng.choice(docs) if docs else "This module has no documentation."
    return f"{_DOC_REQUESTS.pick(rng, split)}\n\n{text}"


_MAKERS = {
    "prose": _prose, "code": _code, "tool": _tool, "chat": _chat, "reasoning": _reasoning, "math": _math,
    "extraction": _extraction, "roleplay": _roleplay, "science": _science, "document": _document,
}


def _check(cls: str | None, split: str) -> None:
    if cls is not None and cls not in CLASSES:
        raise ValueError(f"prompt class {cls!r} is not one of {', '.join(CLASSES)}")
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")


def generate(cls: str, count: int, seed: int, split: str = "train") -> list[Prompt]:
    """`count` prompts of one class from one split, distinct where the class has enough combinations."""
    _check(cls, split)
    rng = random.Random(f"{cls}:{split}:{seed}")
    seen: set[str] = set()
    out: list[Prompt] = []
    for _ in range(count * 20):
        text = _MAKERS[cls](rng, split)
        if text not in seen:
            seen.add(text)
            out.append(Prompt(cls, text))
            if len(out) == count:
                break
    return out


def training_prompts(per_class: int, seed: int = 0, classes=CLASSES) -> list[Prompt]:
    """per_class prompts of each class from the training split, interleaved."""
    sets = [generate(c, per_class, seed) for c in classes]
    # Round robin; a class with fewer distinct prompts than per_class runs out early.
    return [p for group in itertools.zip_longest(*sets) for p in group if p is not None]


def evaluation_prompts(cls: str | None = None, per_class: int = EVAL_PER_CLASS) -> list[Prompt]:
    """The held-out prompts: per class the hand-written ones, then the evaluation split's, up to per_class;
    in rounds of one per class (CLASSES order), so the first four are prose, code, tool and chat."""
    _check(cls, "eval")
    by_class = {}
    for c in CLASSES if cls is None else (cls,):
        hand = [p for p in EVALUATION if p.cls == c][:per_class]
        by_class[c] = hand + generate(c, per_class - len(hand), seed=0, split="eval") if per_class > len(hand) else hand
    rounds = max((len(v) for v in by_class.values()), default=0)
    return [v[i] for i in range(rounds) for v in by_class.values() if i < len(v)]


# ---------------------------------------------------------------------------------------------- other sources

TASK_TYPES = {  # self-instruct: what the target is asked to write a request for, by class
    "prose": "a request for a piece of writing (a story, a poem, an essay, a letter)",
    "code": "a programming question with a concrete task",
    "chat": "a casual question or remark from a person chatting",
    "reasoning": "a logic puzzle or a question that needs careful reasoning",
    "math": "a math word problem with numbers",
    "extraction": "a request to extract information from a short text, with the text included",
    "roleplay": "a request to play a character",
    "science": "a question about how something in nature or technology works",
}


# Areas the target names subjects in (`subject_requests`), for self-instruct requests beyond the fixed
# training subjects: what people ask an assistant about, broad enough that sampled subjects rarely repeat.
SUBJECT_AREAS = (
    "cooking", "gardening", "personal finance", "travel", "sports", "music", "film and television", "history",
    "geography", "medicine and health", "fitness", "psychology", "education", "careers and jobs", "law",
    "economics", "small business", "marketing", "software engineering", "computer hardware", "the internet",
    "video games", "board games", "painting and drawing", "photography", "architecture", "fashion",
    "pets", "wild animals", "farming", "cars and driving", "space and astronomy", "chemistry", "physics",
    "biology", "the ocean", "weather and climate", "energy", "philosophy", "mythology", "literature",
    "languages", "parenting", "friendship", "home repair", "shopping", "nutrition", "government",
    "mathematics", "statistics", "data and spreadsheets", "writing and editing", "public speaking",
    "time management", "the environment", "transport", "crafts and hobbies", "holidays and traditions",
)


def subject_requests(count: int, seed: int = 0) -> list[Prompt]:
    """Instructions that make the target list subjects itself, about ten at a time, in one of SUBJECT_AREAS
    (class "subject"): the items of its sampled lists (`listed_items`, `clean_subject`) widen the training
    subjects. A 135M target names a subject poorly when asked for one, and well as a numbered list."""
    rng = random.Random(f"subjects:{seed}")
    return [Prompt("subject", f"List ten specific topics in {rng.choice(SUBJECT_AREAS)} that people often ask "
                              "about, one per line, a few words each.") for _ in range(count)]


def question_requests(count: int, seed: int = 0) -> list[Prompt]:
    """Instructions that make the target list users' questions itself, about ten at a time, in one of
    SUBJECT_AREAS (class "question"): the items of its sampled lists (`clean_question`) are training prompts."""
    rng = random.Random(f"questions:{seed}")
    return [Prompt("question", f"List ten questions people often ask an AI assistant about "
                               f"{rng.choice(SUBJECT_AREAS)}, one per line.") for _ in range(count)]


# An item's number: at the text's start, a line's, or after a comma or semicolon (a run "1. a, 2. b").
_NUMBERED = re.compile(r"(?:^|\n|[,;])[ \t]*\d{1,2}[.)][ \t]+")


def listed_items(text: str, complete: bool) -> list[str]:
    """The items of a numbered list the target wrote ("1. ..." a line, or in a run), in order, without what
    comes before the first; where the text was cut at its token limit (not `complete`), without the last."""
    items = [re.sub(r"^[-\u2022]\s+", "", x.strip()) for x in _NUMBERED.split(text)[1:]]  # and a bullet after a number
    return [x for x in (items if complete else items[:-1]) if x]


@functools.lru_cache(maxsize=1)
def _evaluation_subjects() -> tuple[str, ...]:
    pools = _TOPICS.eval + _CONCEPTS.eval + [t for t, _ in _TASKS.eval] + _ROLES.eval
    return tuple(x.lower() for x in pools) + _EVALUATION_KEYS


def _holds_evaluation_subject(text: str) -> bool:
    """Whether a text holds an evaluation subject or key (`_EVALUATION_KEYS`), ignoring case."""
    return any(e in text.lower() for e in _evaluation_subjects())


def _first_line(text: str) -> str:
    """A listed item's first line, without the emphasis or quotes around it."""
    return text.strip().splitlines()[0].strip().strip("*\"'").strip() if text.strip() else ""


def clean_subject(text: str) -> str | None:
    """A subject the target listed, as a subject for a request: its first line up to a colon or a dash (an
    explanation follows them), without labels, a second number, emphasis, quotes or closing punctuation, 3
    to 60 characters; None where it is not one (a question is not), or where it holds an evaluation subject
    (evaluation's subjects stay out of everything training sees)."""
    line = re.sub(r"^(topic|subject)\s*:\s*", "", _first_line(text), flags=re.IGNORECASE)
    line = re.split(r":| - | \u2013 ", line)[0]
    line = re.sub(r"^\d{1,2}[.)]\s*", "", line.strip().strip("*\"'").rstrip(".!").strip())
    if not 3 <= len(line) <= 60 or line.endswith("?") or _holds_evaluation_subject(line):
        return None
    return line


def clean_question(text: str) -> str | None:
    """A question the target listed, as a training prompt: its first line, ending in a question mark, 12 to
    200 characters; None where it is not one, or where it holds an evaluation subject."""
    line = _first_line(text)
    if not line.endswith("?") or not 12 <= len(line) <= 200 or _holds_evaluation_subject(line):
        return None
    return line


def subject_prompts(subjects: list[str], seed: int = 0) -> list[Prompt]:
    """Templated training prompts about subjects the target listed (`subject_requests`): one a subject, in turn
    prose, science and role play (the classes whose templates take a subject), each in a training form
    that takes one (and, for role play, a training role): clean requests on far more subjects than the
    fixed pools hold."""
    rng = random.Random(f"subject-prompts:{seed}")
    about = [f for f in _ROLE_FORMS.train if "{t}" in f]  # the role-play forms that take a subject
    out = []
    for i, subject in enumerate(subjects):
        cls = ("prose", "science", "roleplay")[i % 3]
        if cls == "prose":
            text = _PROSE_FORMS.pick(rng, "train").format(t=subject)
        elif cls == "science":
            text = _SCIENCE_FORMS.pick(rng, "train").format(c=subject)
        else:
            text = rng.choice(about).format(role=_ROLES.pick(rng, "train"), t=subject)
        out.append(Prompt(cls, text))
    return out


def self_instruct_requests(count: int, seed: int = 0, subjects: tuple[str, ...] | list[str] = ()) -> list[Prompt]:
    """Instructions that make the target write a user's request itself (self-instruct): a task type and a
    subject each, from the training subjects and `subjects` (ones the target named: `subject_requests`). The
    class is the kind of request asked for; the target's answer becomes a prompt."""
    rng = random.Random(f"self-instruct:{seed}")
    pool = _TOPICS.train + _CONCEPTS.train + [t for t, _ in _TASKS.train] + list(subjects)
    pairs = [(cls, subject) for cls in TASK_TYPES for subject in pool]
    rng.shuffle(pairs)
    # Past every pair once, pairs come again: the target's sampled requests still differ.
    out = []
    for i in range(count):
        cls, subject = pairs[i % len(pairs)]
        out.append(Prompt(cls, f"Write {TASK_TYPES[cls]}, that a user might send to an AI assistant, about "
                               f"{subject}. Write only the user's message, not the answer."))
    return out


@functools.lru_cache(maxsize=1)
def _chitchat(module) -> dict:
    return module.Dataset()  # 40 MB of JSON: read once for both splits


def chitchat_prompts(count: int, seed: int = 0, split: str = "train") -> tuple[list[Prompt], str | None]:
    """Human open-domain conversations (the package chitchat-dataset): per conversation of the split, its first
    1, 3 or 5 turns, the last one the user's and more than a greeting. Returns (prompts, None), or ([], why) where the package is missing."""
    _check(None, split)
    try:
        import chitchat_dataset
    except ImportError:
        return [], "chitchat-dataset is not installed (pip install chitchat-dataset)"
    data = _chitchat(chitchat_dataset)
    rng = random.Random(f"chitchat:{split}:{seed}")
    keys = sorted(k for k in data if held_out(k) == (split == "eval"))
    rng.shuffle(keys)
    out = []
    for key in keys:
        turns = [" ".join(u["text"] for u in m).strip() for m in data[key].get("messages", [])]
        turns = [t for t in turns if t]
        if not turns:
            continue
        n = min(len(turns), rng.choice((1, 3, 3, 5)))
        if n % 2 == 0:  # the last turn is the user's
            n -= 1
        if len(turns[n - 1]) < 12:  # "hi": a greeting says little about a conversation
            continue
        history = tuple(("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(turns[: n - 1]))
        out.append(Prompt("chat", turns[n - 1], history))
        if len(out) == count:
            break
    return out, None


def stdlib_files(split: str) -> list[pathlib.Path]:
    """The standard library's top-level modules of a split (by file name), sorted; the long_prompts
    files are evaluation's."""
    _check(None, split)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))
    return [f for f in files if (held_out(f.name) or f.name in LONG_SOURCES) == (split == "eval")]


_DOCSTRINGS: dict[str, list[str]] = {}
# A module's leading string (after comments and blank lines): parsing every module would take seconds.
_MODULE_DOCSTRING = re.compile(r'(?:[ \t]*(?:#[^\n]*)?\n)*[ \t]*[rRuU]?("""|\'\'\')(.*?)\1', re.DOTALL)


def stdlib_docstrings(split: str, chars: int = 1200) -> list[str]:
    """Module docstrings of at least 300 characters from the split's standard-library files, cut to `chars`
    at a paragraph or line break."""
    if split not in _DOCSTRINGS:
        docs = []
        for f in stdlib_files(split):
            try:
                found = _MODULE_DOCSTRING.match(f.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                continue
            doc = inspect.cleandoc(found.group(2)) if found else None
            if doc and len(doc) >= 300:
                cut = doc[:chars]
                if len(doc) > chars:
                    cut = cut[: max(cut.rfind("\n"), chars // 2)]
                docs.append(cut.strip())
        _DOCSTRINGS[split] = docs
    return _DOCSTRINGS[split]


# Long contexts, for acceptance past the head's window: the start of a standard-library module (present
# wherever Python is) and a request about it.
LONG_SOURCES = ("textwrap.py", "shlex.py", "fractions.py", "csv.py")
LONG_REQUESTS = (
    "Summarize what this module does, then list its public functions.",
    "Explain how this code works, step by step.",
    "Write a short usage example for this module.",
    "Which parts of this code would you test first, and why?",
)


def long_prompts(chars: int = 3600) -> list[Prompt]:
    """One prompt per LONG_SOURCES file: its first `chars` characters and a request (about 900 tokens of the
    target's tokenizer at the default)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name, request in zip(LONG_SOURCES, LONG_REQUESTS):
        source = (root / name).read_text(encoding="utf-8")[:chars]
        out.append(Prompt("long", f"Here is a Python module:\n\n```python\n{source}\n```\n\n{request}"))
    return out
