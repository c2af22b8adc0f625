"""The lists of tests/portable.py name real files, and no file is in two of them."""

from pathlib import Path

from portable import PORTABLE_FILES, PORTABLE_TESTS, TORCH_FREE_FILES

TESTS = Path(__file__).resolve().parent


def test_every_listed_file_and_test_exists():
    for name in PORTABLE_FILES | TORCH_FREE_FILES | set(PORTABLE_TESTS):
        assert (TESTS / name).is_file(), f"tests/portable.py lists {name}, which is not in tests/"
    for name, tests in PORTABLE_TESTS.items():
        source = (TESTS / name).read_text()
        for test in tests:
            assert f"def {test}(" in source, f"tests/portable.py lists {name}::{test}, which is not defined there"


def test_no_file_is_in_two_lists():
    assert not PORTABLE_FILES & TORCH_FREE_FILES
    assert not (PORTABLE_FILES | TORCH_FREE_FILES) & set(PORTABLE_TESTS)
