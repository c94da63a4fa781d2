"""The fault-injection suite: real nodes behind fault proxies, a random workload, a checker."""
