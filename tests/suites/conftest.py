"""The suites here are data for tests/test_junit.py: the main test run never collects them."""

collect_ignore_glob = ["*"]
