"""Real vLLM servers (CPU, the tiny model with random weights) for integration tests.

Register the fixtures in a conftest::

    from tests.integration.vllm_servers import running_vllm_pair, vllm_pair  # noqa: F401

``vllm_pair`` is session-scoped: two servers ("vllm-0" on core 0, "vllm-1" on core 1) serving
"tiny-llama", started once (about 30-45 s on two cores) and shared by every test of the session.
A test that kills one (``servers.kill``) should ``servers.restart`` it before it ends; a test that
needs both running asks for ``running_vllm_pair``, which restarts what an earlier test killed.
Without the engine environment the fixture fails, naming ``make engine``: the integration suite
never passes by skipping its real engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from local.tiny_model import ensure_tiny_model
from local.vllm_launcher import ENGINE_MISSING, VllmServers, engine_python_or_none, server_specs

MODEL = "tiny-llama"


def vllm_servers_fixture(count: int, name: str) -> Callable[..., Iterator[VllmServers]]:
    """A session-scoped fixture called ``name`` yielding ``count`` started servers of ``MODEL``."""

    @pytest.fixture(scope="session", name=name)
    def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServers]:
        python = engine_python_or_none()
        if python is None:
            pytest.fail(ENGINE_MISSING, pytrace=False)
        root = tmp_path_factory.mktemp(name)
        model = ensure_tiny_model(root / "model", MODEL)
        specs = server_specs(count)
        with VllmServers(specs, model, root / "servers", served_model_name=MODEL, python=python) as started:
            yield started

    return servers


vllm_pair = vllm_servers_fixture(2, "vllm_pair")


@pytest.fixture
def running_vllm_pair(vllm_pair: VllmServers) -> VllmServers:
    """``vllm_pair`` with both servers running: one an earlier test killed is restarted first
    (for tests that need the whole pair; module-scoped fixtures use ``vllm_pair`` itself)."""
    vllm_pair.revive()
    return vllm_pair
