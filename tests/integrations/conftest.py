"""a2a-sdk 0.3 and 1.x cannot be installed together: collect the A2A tests of the one that is."""

from importlib.metadata import PackageNotFoundError, version

_A2A_TESTS = {"0": "test_a2a.py", "1": "test_a2a_v1.py"}

try:
    _MAJOR = version("a2a-sdk").split(".")[0]
except PackageNotFoundError:
    _MAJOR = ""

collect_ignore = [name for major, name in _A2A_TESTS.items() if major != _MAJOR]
