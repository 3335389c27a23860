"""Prompts for the real target, by class: prose, code, tool-call JSON and chat.

Each class is a small generator that combines a template with random subjects, so that a few hundred prompts
differ in words, lengths and formats. Training (tfe.train_head) draws from `training_prompts`; the checks and
measurements use `evaluation_prompts`, drawn with another seed and, for the fixed set, written out by hand.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

CLASSES = ("prose", "code", "tool", "chat")


@dataclass(frozen=True)
class Prompt:
    cls: str
    text: str


_TOPICS = [
    "the water cycle", "how bridges carry weight", "the history of the printing press", "why the sky is blue",
    "a lighthouse keeper's day", "how bees make honey", "the first train across a continent", "volcanoes",
    "a city at night", "how vaccines work", "the moon's phases", "a market in the morning", "glaciers",
    "the invention of paper", "how a compass works", "a long walk in the rain", "coral reefs", "photosynthesis",
    "the life of a river", "an old library", "how clocks keep time", "winter in a mountain village",
    "the migration of birds", "a bakery before dawn", "how batteries store energy", "the tides",
]
_PROSE_FORMS = [
    "Write a short paragraph about {t}.", "Explain {t} to a ten-year-old.", "Write a short story about {t}.",
    "Describe {t} in three sentences.", "Write a poem about {t}.", "Give five facts about {t}.",
    "Summarize what you know about {t} in a few lines.", "Write the opening of an essay on {t}.",
]
_TASKS = [
    ("reverse a string", "s"), ("check whether a number is prime", "n"), ("compute the factorial of n", "n"),
    ("merge two sorted lists", "a, b"), ("count the words in a text", "text"), ("flatten a nested list", "xs"),
    ("find the maximum of a list without max()", "xs"), ("compute Fibonacci numbers", "n"),
    ("remove duplicates from a list keeping order", "xs"), ("parse a date string 'YYYY-MM-DD'", "s"),
    ("compute the mean and the median of a list", "xs"), ("convert Celsius to Fahrenheit", "c"),
    ("check whether a string is a palindrome", "s"), ("implement binary search", "xs, x"),
    ("read a CSV file and sum one column", "path, column"), ("compute the GCD of two numbers", "a, b"),
]
_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Rust", "Go", "bash"]
_CODE_FORMS = [
    "Write a {lang} function to {task}.", "In {lang}, how do I {task}? Show the code.",
    "Write a {lang} function `solve({args})` that should {task}, with a short docstring.",
    "Give a {lang} example that shows how to {task}, then explain it briefly.",
]
_TOOLS = [
    ("get_weather", {"city": "string", "unit": "celsius|fahrenheit"}, ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]),
    ("search_flights", {"origin": "string", "destination": "string", "date": "YYYY-MM-DD"}, ["Berlin", "Madrid", "Rome"]),
    ("create_event", {"title": "string", "start": "ISO time", "minutes": "integer"}, ["standup", "review", "lunch"]),
    ("send_email", {"to": "string", "subject": "string", "body": "string"}, ["Ana", "Bo", "Chen", "Dara"]),
    ("convert_currency", {"amount": "number", "from": "ISO code", "to": "ISO code"}, ["EUR", "USD", "JPY", "GBP"]),
]
_CHAT = [
    "Hi! How are you today?", "What should I cook for dinner tonight?", "Can you recommend a good book?",
    "I feel tired after work. Any tips?", "What's a fun weekend activity for a family?",
    "How do I start learning to play the guitar?", "Tell me a joke about computers.",
    "What is the difference between weather and climate?", "How can I sleep better?",
    "Give me three ideas for a birthday gift.", "What are good habits for studying?",
    "How do I politely decline an invitation?", "What is your favorite season and why?",
]
_CHAT_FOLLOW = ["", " Keep it short.", " Please explain step by step.", " Answer in a friendly tone.", " Use a list."]


def _prose(rng: random.Random) -> str:
    return rng.choice(_PROSE_FORMS).format(t=rng.choice(_TOPICS))


def _code(rng: random.Random) -> str:
    task, args = rng.choice(_TASKS)
    return rng.choice(_CODE_FORMS).format(lang=rng.choice(_LANGS), task=task, args=args)


def _tool(rng: random.Random) -> str:
    name, params, values = rng.choice(_TOOLS)
    schema = {"name": name, "parameters": params}
    value = rng.choice(values)
    ask = rng.choice(
        [
            f"You can call this tool: {json.dumps(schema)}. Reply only with the JSON call for a request about {value}.",
            f"Tools: {json.dumps([schema])}\nUser request involving {value}. Output a JSON object "
            '{"tool": ..., "arguments": {...}}.',
            f"Produce a JSON tool call to `{name}` with arguments {', '.join(params)} (use {value}).",
        ]
    )
    return ask


def _chat(rng: random.Random) -> str:
    return rng.choice(_CHAT) + rng.choice(_CHAT_FOLLOW)


_MAKERS = {"prose": _prose, "code": _code, "tool": _tool, "chat": _chat}


def generate(cls: str, count: int, seed: int) -> list[Prompt]:
    """`count` prompts of one class, distinct where the class has enough combinations."""
    rng = random.Random(f"{cls}:{seed}")
    seen: set[str] = set()
    out: list[Prompt] = []
    for _ in range(count * 20):
        text = _MAKERS[cls](rng)
        if text not in seen:
            seen.add(text)
            out.append(Prompt(cls, text))
            if len(out) == count:
                break
    return out


def training_prompts(per_class: int, seed: int = 0) -> list[Prompt]:
    """per_class prompts of each class, interleaved."""
    sets = [generate(c, per_class, seed) for c in CLASSES]
    return [p for group in zip(*sets) for p in group]


# The fixed evaluation set: one per class first, so that any prefix of it covers prose, code and tool calls.
EVALUATION = [
    Prompt("prose", "Write a short paragraph about the history of the bicycle."),
    Prompt("code", "Write a Python function that returns the n-th Fibonacci number, with a docstring."),
    Prompt("tool", 'You can call this tool: {"name": "get_weather", "parameters": {"city": "string"}}. '
                   "Reply only with the JSON call for the weather in Vienna."),
    Prompt("chat", "What are three good habits for learning a new language?"),
    Prompt("prose", "Explain how a refrigerator keeps food cold."),
    Prompt("code", "Write a Python class for a stack with push, pop and peek."),
    Prompt("tool", "Produce a JSON tool call to `send_email` with arguments to, subject and body (to Maria)."),
    Prompt("chat", "Can you suggest a simple breakfast recipe?"),
]


def evaluation_prompts(cls: str | None = None) -> list[Prompt]:
    return [p for p in EVALUATION if cls is None or p.cls == cls]


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
    import pathlib
    import sysconfig

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out = []
    for name, request in zip(LONG_SOURCES, LONG_REQUESTS):
        source = (root / name).read_text(encoding="utf-8")[:chars]
        out.append(Prompt("long", f"Here is a Python module:\n\n```python\n{source}\n```\n\n{request}"))
    return out
