import pickle

import numpy as np
import pytest

from raylf.data.ragged import Ragged

PARTS = [np.array([5, 1, 3]), np.array([], dtype=np.int64), np.array([7]), np.array([2, 0])]


def test_reads_like_the_list_it_replaces():
    r = Ragged.from_parts(PARTS)
    assert len(r) == 4
    assert [list(p) for p in r] == [list(p) for p in PARTS]
    assert list(r[-1]) == [2, 0] and list(r[1]) == []
    assert r.lengths.tolist() == [3, 0, 1, 2]
    assert r.owners().tolist() == [0, 0, 0, 2, 3, 3]
    assert r.positions().tolist() == [0, 1, 2, 0, 0, 1]
    with pytest.raises(IndexError):
        r[4]
    again = pickle.loads(pickle.dumps(r))
    assert [list(p) for p in again] == [list(p) for p in PARTS]


def test_take_gathers_clients_in_the_order_asked():
    r = Ragged.from_parts(PARTS)
    assert [list(p) for p in r.take(np.array([3, 0, 1]))] == [[2, 0], [5, 1, 3], []]
    assert len(r.take(np.array([], dtype=np.int64))) == 0


def test_shuffle_permutes_within_each_client_only_and_follows_the_seed():
    r = Ragged.from_parts([np.arange(k * 100, k * 100 + 50) for k in range(5)])
    a = r.shuffled(np.random.default_rng(1))
    b = r.shuffled(np.random.default_rng(1))
    assert np.array_equal(a.flat, b.flat)
    assert not np.array_equal(a.flat, r.flat)
    for before, after in zip(r, a):
        assert sorted(after) == list(before)
    assert [list(p) for p in a.sorted()] == [list(p) for p in r]


def test_cut_splits_every_list_at_its_own_point():
    r = Ragged.from_parts(PARTS)
    head, tail = r.cut(np.array([1, 0, 0, 2]))
    assert [list(p) for p in head] == [[5], [], [], [2, 0]]
    assert [list(p) for p in tail] == [[1, 3], [], [7], []]
