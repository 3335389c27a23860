"""The prompt classes and their split: evaluation shares no prompt, template or subject with training."""

import pytest

from tfe import prompts


def test_evaluation_covers_every_class_in_rounds():
    ev = prompts.evaluation_prompts()
    assert [p.cls for p in ev[: len(prompts.CLASSES)]] == list(prompts.CLASSES)
    assert [p.cls for p in ev[:4]] == ["prose", "code", "tool", "chat"]  # what the exactness checks take
    for c in prompts.CLASSES:
        got = prompts.evaluation_prompts(c)
        assert len(got) == prompts.EVAL_PER_CLASS and {p.cls for p in got} == {c}
        assert len({p.text for p in got}) == len(got)


def test_evaluation_prompts_are_not_training_prompts():
    train = {p.text for p in prompts.training_prompts(400, seed=0)} | {p.text for p in prompts.training_prompts(400, seed=1)}
    assert len(train) > 3000
    assert not train & {p.text for p in prompts.evaluation_prompts(per_class=20)}


def test_evaluation_subjects_never_reach_training():
    train = " ".join(p.text for p in prompts.training_prompts(400, seed=0) + prompts.self_instruct_requests(200))
    for pool in (prompts._TOPICS, prompts._CONCEPTS, prompts._ROLES, prompts._CITIES):
        for subject in pool.eval:
            assert subject not in train, subject
    for name, _, _ in prompts._TOOLS.eval:
        assert f'"{name}"' not in train and f"`{name}`" not in train, name


def test_lists_the_target_writes_become_subjects_and_questions():
    """listed_items takes a numbered list's items (a line each or in a run; a list cut at its token limit loses
    its last); clean_subject keeps a subject without labels, explanations, quotes or closing punctuation, and
    clean_question a question; both refuse what holds an evaluation subject. Subjects then fill training
    templates and the self-instruct requests."""
    text = "Sure, here are ten topics:\n\n1. Air Pollution\n2. **Credit score**: what lenders see\n3. Tax preparation - forms\n4. Environmental Awa"
    assert prompts.listed_items(text, complete=False) == ["Air Pollution", "**Credit score**: what lenders see", "Tax preparation - forms"]
    assert prompts.listed_items(text, complete=True)[-1] == "Environmental Awa"
    assert prompts.listed_items("1. Financial planning, 2. Home ownership, 3. Bank cards", complete=True) == [
        "Financial planning", "Home ownership", "Bank cards"]
    # A number inside an item starts none; a bullet after the number goes.
    assert prompts.listed_items("1. Web version 2. 0\n2) - Room 12) decor", complete=True) == ["Web version 2. 0", "Room 12) decor"]
    assert prompts.listed_items("No list here.", complete=True) == []
    assert [prompts.clean_subject(x) for x in prompts.listed_items(text, complete=False)] == ["Air Pollution", "Credit score", "Tax preparation"]
    assert prompts.clean_subject("Topic: Sourdough bread.") == "Sourdough bread"
    assert prompts.clean_subject("2. Chemistry and the Laboratory") == "Chemistry and the Laboratory"
    assert prompts.clean_subject("What's the best board game?") is None
    assert prompts.clean_subject('"Budgeting for retirement"\nIt is a common question.') == "Budgeting for retirement"
    assert prompts.clean_subject("") is None and prompts.clean_subject("ok") is None and prompts.clean_subject("a" * 61) is None
    held = prompts._CONCEPTS.eval[0]
    assert prompts.clean_subject(f"Questions about {held.upper()}") is None
    assert prompts.clean_question("How can I improve my time management?") == "How can I improve my time management?"
    assert prompts.clean_question("What is architecture") is None and prompts.clean_question("Why?") is None
    assert prompts.clean_question(f"How does {held} work?") is None
    # Nor, in other words, what an evaluation prompt asks: every one about a subject holds a key.
    for asked in ("How do earthquakes happen?", "What does DNA do?", "Why does ice float on water?",
                  "Can you suggest a quick breakfast?", "How does a fridge or refrigerator work?"):
        assert prompts.clean_question(asked) is None, asked
    assert prompts.clean_subject("Volcanoes") is None and prompts.clean_subject("Stock market") == "Stock market"
    for p in prompts.evaluation_prompts(per_class=prompts.EVAL_PER_CLASS):
        if p.cls in ("prose", "code", "chat", "roleplay", "science"):
            assert prompts._holds_evaluation_subject(p.text), p.text
    for make, cls in ((prompts.subject_requests, "subject"), (prompts.question_requests, "question")):
        asks = make(50, seed=3)
        assert len(asks) == 50 and {p.cls for p in asks} == {cls} and asks == make(50, seed=3)
        assert len({p.text for p in asks}) > 20  # areas vary
    every = len(prompts.TASK_TYPES) * 64  # past the fixed subjects' pairs, the listed ones come too
    named = " ".join(p.text for p in prompts.self_instruct_requests(every, subjects=["sourdough bread"]))
    assert "sourdough bread" in named
    assert "sourdough bread" not in " ".join(p.text for p in prompts.self_instruct_requests(every))
    # Each listed subject fills a training template of prose, science or role play, in turn.
    subjects = ["sourdough bread", "tax returns", "chess openings", "bird songs"]
    made = prompts.subject_prompts(subjects, seed=1)
    assert [p.cls for p in made] == ["prose", "science", "roleplay", "prose"]
    assert all(s in p.text for s, p in zip(subjects, made))
    forms = " ".join(p.text for p in prompts.subject_prompts(["X"] * 300, seed=2))
    assert not any(r in forms for r in prompts._ROLES.eval)
    evaluation_forms = [f.split("{")[0] for f in prompts._PROSE_FORMS.eval + prompts._SCIENCE_FORMS.eval + prompts._ROLE_FORMS.eval]
    assert not any(f in forms for f in evaluation_forms if len(f) > 12)


def test_sources_split_by_file():
    train, held = set(prompts.stdlib_files("train")), set(prompts.stdlib_files("eval"))
    assert train and held and not train & held
    assert {f.name for f in held} >= set(prompts.LONG_SOURCES)
    assert prompts.stdlib_docstrings("train") and prompts.stdlib_docstrings("eval")


def test_unknown_class_or_split_is_refused():
    with pytest.raises(ValueError, match="prompt class 'poetry'"):
        prompts.evaluation_prompts("poetry")
    with pytest.raises(ValueError, match="split 'test'"):
        prompts.generate("code", 3, 0, split="test")


def test_conversations_split_by_conversation():
    train, why = prompts.chitchat_prompts(300, split="train")
    if why:
        pytest.skip(why)
    held, _ = prompts.chitchat_prompts(300, split="eval")
    assert len(train) == 300 and len(held) == 300
    assert all(p.cls == "chat" and len(p.history) % 2 == 0 and len(p.text) >= 12 for p in train + held)
    # Conversations, not just turns, are apart: no held-out turn appears in a training prompt.
    seen = {p.text for p in train} | {t for p in train for _, t in p.history}
    assert not {p.text for p in held if len(p.text) > 40} & seen
