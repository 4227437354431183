import pytest

from tests.speed import frozen_heap, quick_polls  # noqa: F401 (fixtures: named by the script tests)


@pytest.fixture(autouse=True)
def _every_script_test_with_the_heap_frozen(request):
    """Their benchmarks' gc.collect() calls skip the heap alive before the test (tests/speed.py: frozen_heap)."""
    request.getfixturevalue("frozen_heap")
