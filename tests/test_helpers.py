"""The tests' own helpers fail where they checked nothing (#39)."""
from __future__ import annotations

import pytest
from _util import assert_every_rank


def test_assert_every_rank_fails_on_nothing_checked():
    assert_every_rank([[True, True], {"a": True}])
    for empty in ([], [[True], []], [{}]):
        with pytest.raises(AssertionError):
            assert_every_rank(empty)
    with pytest.raises(AssertionError, match=r"rank 1: \['b'\]"):
        assert_every_rank([{"a": True}, {"a": True, "b": False}])
