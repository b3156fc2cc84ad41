"""Tests count the library's open handles (staging.handles_live) against a
baseline taken when they start. A handle whose Python object is garbage
closes when the collector runs, which may be in the middle of the next test
(a failed test's frames are such garbage once pytest drops its traceback):
the next test then counts one handle fewer. Collecting before and after
every test closes a test's leftovers inside its own run."""
import gc

import pytest


@pytest.fixture(autouse=True)
def _close_leftover_handles():
    gc.collect()
    yield
    gc.collect()
