"""pytest plugin: ``make nbval``'s schedule. Each chapter runs whole in
one worker, each chapter's nbgrader grading is a piece of work of its
own, and the longest pieces start first.

``make nbval`` runs the chapters and ``tests/test_assignments.py`` on two
workers (pytest-xdist, ``-n 2 -p whole_chapters``). xdist hands out work
a group of tests at a time; this plugin's scheduler forms the groups
from each test's id (:func:`group_of`, the keys of
``tools/chapter_times.py``):

* ``"NN"``: every cell of chapter NN (nbval's cells run in order, in one
  kernel, so a chapter is never split);
* ``"NN grading"``: the tests of chapter NN's grading, which grade its
  versions once per worker (the ``graded`` fixture);
* ``"assignments"``: the tests of every assignment at once;
* any other test: its file.

The collection is ordered by each group's last measured seconds
(``timings.json``, written by ``make chapter-times``), longest first, so
that the two workers finish close together: a long chapter handed out
last would leave the other worker idle while it runs. (xdist's own
``--dist loadgroup`` cannot serve: its ``xdist_group`` marks work by
renaming test ids, which pytest 9 no longer allows.)
"""

import pytest
from chapter_times import expected_seconds, timing_key
from xdist.scheduler import LoadScopeScheduling


def group_of(nodeid: str) -> str:
    """The piece of work a test belongs to, from its id."""
    where, _, name = nodeid.partition("::")
    return timing_key(where, name) or where


def longest_first(nodeids: list[str]) -> list[int]:
    """The order (indices into ``nodeids``) that runs the groups by their
    expected seconds, longest first, each group's tests together and in
    their own order; unmeasured groups last, in the order given."""
    groups = [group_of(n) for n in nodeids]
    first = {}
    for i, group in enumerate(groups):
        first.setdefault(group, i)
    seconds = {group: expected_seconds(group) for group in first}

    def start(i: int) -> tuple[int, int]:
        return -seconds[groups[i]], first[groups[i]]

    return sorted(range(len(nodeids)), key=start)


@pytest.hookimpl(trylast=True)  # after every plugin that filters the tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    order = longest_first([item.nodeid for item in items])
    items[:] = [items[i] for i in order]


class WholeChapters(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`group_of` as the scope, in
    the collection's order (no reordering by the groups' sizes)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # keep longest first

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return WholeChapters(config, log)
