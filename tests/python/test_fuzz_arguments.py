"""A seeded fuzz of the Python door's argument checks: tfe.Reference's extend (both forms), extend_batch, draft
and reset, and tfe.AcceptLog.record, called with valid arguments and with one argument broken at a time
(another dtype, float16, int64, bool, ndim, shape, 0 size, strides that are not C-contiguous, negative or 0,
misaligned data, read-only, Python objects, integers at and past the limits).

Every call must either succeed or raise ValueError (tfe.Error) or TypeError whose message names the argument,
and never crash. A twin receives only the calls that succeeded: after every refused call the two must draft
the same (a refusal changes nothing), and a valid call must succeed on both. An array of one int where an
int belongs, and a `kept` that is no sequence, have a test of their own at the end.
"""

import numpy as np
import pytest

import tfe

SEED = 45
CALLS = 4000
SLOTS, STEPS = 4, 4
INT_LIMITS = [-(2**63), -(2**31) - 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64]

# The words that name each argument in a refusal (a position is named as such: "first position 8 does not
# continue the slot").
NAMES = {
    "slot": ("slot",),
    "first_pos": ("first_pos", "position"),
    "taps": ("taps",),
    "tokens": ("tokens",),
    "slots": ("slots", "slot "),
    "counts": ("counts", "a span of 0 rows"),  # a count of 0 is refused as the span it gives
    "starts": ("starts",),
    "steps": ("steps",),
    "kept": ("kept",),
}

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
          np.uint32, np.uint64, np.bool_, np.complex64]


def broken_array(rng, a):
    """`a` (a valid host array) broken one way, or a valid variant of it."""
    rows = a.shape[0]
    options = [
        lambda: a.astype(DTYPES[rng.integers(len(DTYPES))]),
        lambda: a[None],
        lambda: a[..., None],
        lambda: a.reshape(-1),
        lambda: np.asarray(a.flat[0]) if a.size else np.zeros((), a.dtype),
        lambda: a[: max(rows - 1, 0)],
        lambda: np.concatenate([a, a[:1]]) if rows else a,
        lambda: a[:, :-1] if a.ndim == 2 else a[:0],
        lambda: np.concatenate([a, a[:, :1]], axis=1) if a.ndim == 2 else a[:, None],
        lambda: a[:0],
        lambda: np.lib.stride_tricks.as_strided(a, (0,) + a.shape[1:], (0,) * a.ndim),
        lambda: a[:, :0] if a.ndim == 2 else np.empty(0, a.dtype),
        lambda: np.repeat(a, 2, axis=-1)[..., ::2],  # the same values, every other element
        lambda: a[::-1],
        lambda: np.asfortranarray(a),
        lambda: a.T,
        lambda: np.broadcast_to(a[:1], a.shape) if rows else a,
        lambda: np.frombuffer(b"\0" + a.tobytes(), dtype=np.uint8)[1:].view(a.dtype).reshape(a.shape),  # misaligned
        lambda: read_only(a),
        lambda: a.tolist(),
        lambda: None,
        lambda: "0",
        lambda: 1.5,
        lambda: {"rows": a},
        lambda: memoryview(np.ascontiguousarray(a)),
    ]
    return options[rng.integers(len(options))]()


def read_only(a):
    b = a.copy()
    b.setflags(write=False)
    return b


def broken_int(rng, good):
    options = [
        lambda: INT_LIMITS[rng.integers(len(INT_LIMITS))],
        lambda: good + int(rng.integers(-3, 4)),
        lambda: float(good),
        lambda: str(good),
        lambda: None,
        lambda: True,
        lambda: np.int64(good),
        lambda: np.float32(good),
        lambda: [good],
        lambda: np.array(good),  # a 0-d array: an int by __index__
    ]
    return options[rng.integers(len(options))]()


def broken_ints(rng, good):
    """A list of ints broken: as arrays of every dtype and layout, with values at the limits, or wrong objects."""
    a = np.asarray(good, dtype=np.int64)
    options = [
        lambda: broken_array(rng, a),
        lambda: [*good[:-1], INT_LIMITS[rng.integers(len(INT_LIMITS))]] if good else [0],
        lambda: [*good, good[0] if good else 0],
        lambda: good[1:],
        lambda: [float(v) for v in good] or [0.5],
        lambda: tuple(good),
        lambda: range(len(good)),
        lambda: np.asarray(good, dtype=np.int32),
        lambda: iter(good),
    ]
    return options[rng.integers(len(options))]()


class Twins:
    """The fuzzed reference and its twin, which receives only the calls that succeeded; a model of each slot's
    next position gives the valid calls."""

    def __init__(self, head, rng):
        self.fuzzed = tfe.Reference(head, max_slots=SLOTS, max_steps=STEPS)
        self.twin = tfe.Reference(head, max_slots=SLOTS, max_steps=STEPS)
        self.log, self.twin_log = tfe.AcceptLog(), tfe.AcceptLog()
        self.h = head.header
        self.width = len(self.h["taps"]) * self.h["target_hidden"]
        self.next = [None] * SLOTS  # each slot's next position; None: empty
        self.rng = rng

    def rows(self, n):
        taps = self.rng.standard_normal((n, self.width), dtype=np.float32)
        bits = (taps.view(np.uint32) >> 16).astype(np.uint16)
        return bits, self.rng.integers(0, self.h["vocab"], n, dtype=np.int32)

    def good_request(self, slot):
        n = int(self.rng.integers(1, 5))
        first = self.next[slot] if self.next[slot] is not None else int(self.rng.integers(0, 50))
        return [slot, first, *self.rows(n)]

    def filled(self):
        return [s for s in range(SLOTS) if self.next[s] is not None]

    def same_drafts(self):
        slots = self.filled()
        if slots:
            a, b = self.fuzzed.draft(slots, STEPS), self.twin.draft(slots, STEPS)
            assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.confidences, b.confidences)
        assert self.log.totals() == self.twin_log.totals()


def call(twins, name, args, broken, on_success, **kwargs):
    """Calls `name` on the fuzzed objects; a success is repeated on the twins and `on_success` updates the
    model; a refusal must name the broken argument and change nothing."""
    target = twins.log if name == "record" else twins.fuzzed
    twin = twins.twin_log if name == "record" else twins.twin
    try:
        getattr(target, name)(*args, **kwargs)
    except (ValueError, TypeError) as e:  # tfe.Error is a ValueError
        message = str(e)
        assert broken is not None, f"{name}{tuple(map(type, args))}: a valid call was refused: {message}"
        assert any(w in message for w in NAMES[broken]), f"{name}, {broken} broken: the refusal names it not: {message}"
        twins.same_drafts()
        return False
    getattr(twin, name)(*args, **kwargs)
    on_success()
    return True


def fuzz_extend(twins, rng):
    slot = int(rng.integers(SLOTS))
    req = twins.good_request(slot)
    broken = None
    if rng.random() < 0.7:
        i = int(rng.integers(4))
        broken = ("slot", "first_pos", "taps", "tokens")[i]
        req[i] = broken_int(rng, req[i]) if i < 2 else broken_array(rng, req[i])

    def moved():
        rows = len(req[3])
        if rows:
            twins.next[int(req[0])] = int(req[1]) + rows

    return call(twins, "extend", req, broken, moved)


def fuzz_extend_list(twins, rng):
    slots = [int(s) for s in rng.permutation(SLOTS)[: int(rng.integers(1, 3))]]
    requests = [twins.good_request(s) for s in slots]
    broken = None
    if rng.random() < 0.7:
        r, i = int(rng.integers(len(requests))), int(rng.integers(4))
        broken = ("slot", "first_pos", "taps", "tokens")[i]
        requests[r][i] = broken_int(rng, requests[r][i]) if i < 2 else broken_array(rng, requests[r][i])

    def moved():
        for s, first, _, tokens in requests:
            if len(tokens):
                twins.next[int(s)] = int(first) + len(tokens)

    return call(twins, "extend", [[tuple(r) for r in requests]], broken, moved)


def fuzz_extend_batch(twins, rng):
    slots = [int(s) for s in rng.permutation(SLOTS)[: int(rng.integers(1, SLOTS + 1))]]
    parts = [twins.good_request(s) for s in slots]
    args = {
        "slots": slots,
        "first_pos": [p[1] for p in parts],
        "counts": [len(p[3]) for p in parts],
        "taps": np.concatenate([p[2] for p in parts]),
        "tokens": np.concatenate([p[3] for p in parts]),
        "starts": None,
    }
    if rng.random() < 0.5:  # explicit starts over rows in another order
        order = rng.permutation(len(parts))
        args["taps"] = np.concatenate([parts[i][2] for i in order])
        args["tokens"] = np.concatenate([parts[i][3] for i in order])
        at = np.cumsum([0] + [args["counts"][i] for i in order])
        args["starts"] = [int(at[list(order).index(i)]) for i in range(len(parts))]
    broken = None
    if rng.random() < 0.7:
        broken = list(args)[int(rng.integers(6))]
        if broken in ("taps", "tokens"):
            args[broken] = broken_array(rng, args[broken])
        elif broken == "starts" and args["starts"] is None:
            args["starts"] = broken_ints(rng, [0] * len(slots))
        else:
            args[broken] = broken_ints(rng, args[broken])
    values = dict(args)

    def moved():
        for s, first, n in zip(values["slots"], values["first_pos"], values["counts"]):
            if int(n):
                twins.next[int(s)] = int(first) + int(n)

    positional = [args[k] for k in ("slots", "first_pos", "counts", "taps", "tokens")]
    return call(twins, "extend_batch", positional, broken, moved, starts=args["starts"])


def fuzz_draft(twins, rng):
    slots = twins.filled()
    if not slots:
        return False
    slots = [int(s) for s in rng.permutation(slots)[: int(rng.integers(1, len(slots) + 1))]]
    steps = int(rng.integers(1, STEPS + 1))
    broken = None
    if rng.random() < 0.7:
        broken = "slots" if rng.random() < 0.6 else "steps"
        if broken == "slots":
            slots = broken_ints(rng, slots)
        else:
            steps = broken_int(rng, steps)
    return call(twins, "draft", [slots, steps], broken, lambda: None)


def fuzz_reset(twins, rng):
    slot = int(rng.integers(SLOTS))
    broken = None
    if rng.random() < 0.5:
        broken, slot = "slot", broken_int(rng, slot)

    def emptied():
        twins.next[int(slot)] = None

    return call(twins, "reset", [slot], broken, emptied)


def fuzz_record(twins, rng):
    steps = int(rng.integers(1, 9))
    kept = [int(k) for k in rng.integers(0, steps + 1, int(rng.integers(1, 5)))]
    broken = None
    if rng.random() < 0.7:
        broken = "kept" if rng.random() < 0.6 else "steps"
        if broken == "kept":
            kept = broken_ints(rng, kept)
            if isinstance(kept, type(iter([]))):
                kept = list(kept)  # read once by each of the twins
            elif not hasattr(kept, "__iter__") or (isinstance(kept, np.ndarray) and kept.ndim != 1):
                kept = [None]  # see test_arrays_and_none_where_ints_belong_are_refused_by_name
        else:
            steps = broken_int(rng, steps)
    return call(twins, "record", [kept, steps], broken, lambda: None)


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory):
    return tfe.random_head("tiny", tmp_path_factory.mktemp("fuzz") / "tiny.tfe", seed=3)


def test_broken_arguments_are_refused_by_name_and_change_nothing(tiny_head):
    rng = np.random.default_rng(SEED)
    twins = Twins(tiny_head, rng)
    entries = [fuzz_extend, fuzz_extend, fuzz_extend_list, fuzz_extend_batch, fuzz_draft, fuzz_reset, fuzz_record]
    done = {f.__name__: [0, 0] for f in entries}  # calls, successes
    for _ in range(CALLS):
        f = entries[int(rng.integers(len(entries)))]
        ok = f(twins, rng)
        done[f.__name__][0] += 1
        done[f.__name__][1] += bool(ok)
    twins.same_drafts()
    # Both outcomes were exercised at every entry point.
    for name, (calls, successes) in done.items():
        assert 0 < successes < calls, f"{name}: {successes} of {calls} calls succeeded"


def one_row(ref):
    h = ref.header
    return np.zeros((1, len(h["taps"]) * h["target_hidden"]), np.uint16), np.zeros(1, np.int32)


@pytest.mark.parametrize(
    "name, call",
    [
        ("slot", lambda ref: ref.reset(np.array([0]))),
        ("first_pos", lambda ref: ref.extend(0, np.array([0]), *one_row(ref))),
        ("steps", lambda ref: ref.draft([0], np.array([1]))),
        ("steps", lambda ref: tfe.AcceptLog().record([0], np.array([1]))),
        ("kept", lambda ref: tfe.AcceptLog().record(None, 1)),
        ("kept", lambda ref: tfe.AcceptLog().record(1.5, 1)),
        ("kept", lambda ref: tfe.AcceptLog().record(np.zeros((1, 1), np.int32), 1)),
    ],
    ids=["reset-slot", "extend-first_pos", "draft-steps", "record-steps", "record-kept-None", "record-kept-float",
         "record-kept-2d"],
)
def test_arrays_and_none_where_ints_belong_are_refused_by_name(tiny_head, name, call):
    """An array of one int where an int belongs, and None or a float where a list of ints belongs: a TypeError
    that names the argument."""
    ref = tfe.Reference(tiny_head, max_slots=SLOTS, max_steps=STEPS)
    with pytest.raises(TypeError, match=name):
        call(ref)
