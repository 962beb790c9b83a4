"""The SDK tests reuse the farm tests' compiled env."""

from tests.envfarm.farm.conftest import hotel_runtime  # noqa: F401 - a fixture
