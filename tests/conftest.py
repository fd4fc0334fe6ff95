"""Fixtures every test directory may use, registered once here (pytest reads `pytest_plugins`
only from the top-level conftest): the embedded `store`, the end-to-end processes (`backend_pair`,
`gateway`) and the real vLLM (`vllm_server`, `vllm_gateway`). A conftest or module fixture of the
same name takes precedence."""

pytest_plugins = ("tests.gateway.fixtures_store", "tests.gateway.fixtures_e2e", "tests.vllm.fixtures")
