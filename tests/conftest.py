"""Shared pytest configuration for the test suite.

`--rewrite` regenerates the expected output of the Raft transcript tests
(`tests/raft/testdata/*.txt`, replayed by `tests/raft/test_transcripts.py`) instead of comparing.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rewrite",
        action="store_true",
        default=False,
        help="regenerate the expected output of transcript tests (tests/raft/testdata/*.txt)",
    )
