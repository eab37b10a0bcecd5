"""Helpers shared by the test files (a test file never imports another: tests/test_tests.py):
``cli`` (the command as a subprocess, scripted turns, a tiny corpus), ``serve`` (a run
registry on the scripted model, reading event streams), ``search`` (a fake Serper/SearXNG
server), ``rl`` (DR-Venus's RL fixture texts), ``reference`` (``--protocol dr-venus`` on the
fixture checkout), ``templates`` (chat templates)."""
