"""Fixtures every test directory may use, registered once here (pytest reads `pytest_plugins`
only from the top-level conftest): the embedded `store` and the end-to-end processes
(`backend_pair`, `gateway`). A conftest or module fixture of the same name takes precedence."""

pytest_plugins = ("tests.gateway.fixtures_store", "tests.gateway.fixtures_e2e")
