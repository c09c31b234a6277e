"""The admission state machine under many random schedules: the staleness rule and the ledger."""

from __future__ import annotations

import random

import pytest

from rlvr.rollouts.admission import Admission, Admit, Poll, RowDone, Train, Trained, Want


def simulate(seed: int, *, rows: int, offpolicy: int, in_flight: int | None, keep_p: float,
             cap: int | None, demand: bool, trains: int = 30) -> dict:
    """Drive the machine with random event orders; check every invariant on the way."""
    rng = random.Random(seed)
    m = Admission(rows, offpolicy, max_in_flight=in_flight, max_rows_per_batch=cap, demand_driven=demand)
    admitted: dict[int, Admit] = {}
    sampling: set[int] = set()
    fate: dict[int, str] = {}
    training: Train | None = None
    trained: list[Train] = []

    def apply(actions):
        nonlocal training
        for a in actions:
            if isinstance(a, Admit):
                assert a.seq not in admitted, "a row admitted twice"
                assert a.version == m.version
                assert a.version <= a.batch <= a.version + offpolicy, "slot outside the staleness window"
                admitted[a.seq] = a
                sampling.add(a.seq)
            else:
                assert training is None, "two batches handed out at once"
                assert m.version == a.version
                training = a
        if in_flight is not None:
            assert len(sampling) <= in_flight
        if demand and training is not None:
            assert not sampling, "synchronous admission left rows sampling during a train step"

    apply(m.handle(Poll()))
    guard = 0
    while len(trained) < trains:
        guard += 1
        assert guard < 100_000, "the schedule deadlocked"
        choices = []
        if sampling:
            choices += ["finish"] * 3
        if training is not None:
            choices.append("train")
        if not m.waiting and training is None:
            choices.append("want")
        assert choices, "nothing can happen: deadlock"
        move = rng.choice(choices)
        if move == "finish":
            seq = rng.choice(sorted(sampling))
            sampling.remove(seq)
            kept = rng.random() < keep_p
            fate[seq] = "kept" if kept else "filtered"
            apply(m.handle(RowDone(seq, kept)))
        elif move == "want":
            apply(m.handle(Want()))
        else:
            assert training is not None
            assert len(training.seqs) <= rows
            for seq in training.seqs:
                assert fate.get(seq) == "kept", "a batch holds a row that was not kept"
                assert admitted[seq].batch == training.version
                assert training.version - admitted[seq].version <= offpolicy, "a stale row was trained"
                fate[seq] = "trained"
            trained.append(training)
            training = None
            apply(m.handle(Trained()))
    return {"admitted": admitted, "fate": fate, "sampling": sampling, "trained": trained, "machine": m}


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("offpolicy", [0, 1, 3])
def test_random_schedules_keep_the_staleness_bound_and_lose_nothing(seed, offpolicy):
    rng = random.Random(seed)
    rows = rng.randint(1, 6)
    out = simulate(seed, rows=rows, offpolicy=offpolicy, in_flight=rng.choice([None, 1, 3, 8]),
                   keep_p=rng.choice([1.0, 0.7, 0.3]), cap=rng.choice([None, rows * 2, rows * 4]), demand=False)
    fate, sampling = out["fate"], out["sampling"]
    # Every admitted row is trained, filtered, still sampling, or kept and waiting for its batch.
    for seq in out["admitted"]:
        assert fate.get(seq) in ("trained", "filtered", "kept") or seq in sampling
    waiting = [s for s, f in fate.items() if f == "kept"]
    assert all(out["admitted"][s].batch >= out["machine"].version for s in waiting)
    trained = [s for t in out["trained"] for s in t.seqs]
    assert len(trained) == len(set(trained))  # nothing trained twice


@pytest.mark.parametrize("seed", range(20))
def test_synchronous_admission_never_samples_during_training(seed):
    out = simulate(seed, rows=4, offpolicy=0, in_flight=None, keep_p=0.6, cap=12, demand=True)
    assert all(t.version == i for i, t in enumerate(out["trained"]))


def test_full_batches_follow_the_capacity_formula():
    # With nothing filtered, admission tops up to (O + v + 1)·B − (accepted + running).
    B, O = 4, 2  # noqa: E741 - O is the staleness bound's name in the docs
    m = Admission(B, O)
    first = m.handle(Poll())
    assert len(first) == (O + 1) * B and {a.batch for a in first} == {0, 1, 2}
    for a in first[:B]:
        m.handle(RowDone(a.seq, True))
    train = [a for a in m.handle(Want()) if isinstance(a, Train)]
    assert train and train[0].seqs == tuple(a.seq for a in first[:B])
    after = m.handle(Trained())
    assert len(after) == B and {a.batch for a in after} == {3} and all(a.version == 1 for a in after)


def test_resume_at_a_version_neither_bursts_nor_starves():
    m = Admission(8, 1, version=37)
    admits = m.handle(Poll())
    assert len(admits) == 16 and {a.batch for a in admits} == {37, 38}


def test_a_filtered_row_is_replaced_until_the_cap():
    m = Admission(2, 0, max_rows_per_batch=3)
    a, b = m.handle(Poll())
    m.handle(Want())
    (c,) = m.handle(RowDone(a.seq, False))  # one replacement: three admitted, the cap
    assert m.handle(RowDone(b.seq, True)) == []
    (train,) = m.handle(RowDone(c.seq, False))  # cap spent: train on what there is
    assert isinstance(train, Train) and train.seqs == (b.seq,) and train.admitted == 3 and train.filtered == 2


def test_a_batch_is_handed_out_only_on_demand():
    m = Admission(1, 0)
    (a,) = m.handle(Poll())
    assert m.handle(RowDone(a.seq, True)) == []
    actions = m.handle(Want())
    assert [type(x) for x in actions] == [Train]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="max_offpolicy must be 0"):
        Admission(4, 1, demand_driven=True)
    with pytest.raises(ValueError, match="rows_per_batch"):
        Admission(0)
    with pytest.raises(RuntimeError, match="Trained without a batch"):
        Admission(1).handle(Trained())
