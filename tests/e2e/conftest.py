"""Every test under tests/e2e is in the e2e tier (`make test`; plain `pytest` skips it), marked
here so that a new e2e module cannot land in the fast tier by forgetting its marker."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/e2e/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.e2e)
