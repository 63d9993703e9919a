"""Repository-wide pytest plugins: the real-server fixtures (tests/servers.py) for every test tree."""

pytest_plugins = ["tests.servers"]
