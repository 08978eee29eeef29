"""The worker registry's I/O: registration and discovery jobs (``service``), engine probes
(``probe``), the health checker (``health``) and the worker keys (``keys``)."""

from smgrl.registry.health import HealthChecker
from smgrl.registry.keys import KeyRing
from smgrl.registry.probe import GATEWAY_ID_HEADER
from smgrl.registry.service import Registration, RegistryService

__all__ = [
    "GATEWAY_ID_HEADER",
    "HealthChecker",
    "KeyRing",
    "Registration",
    "RegistryService",
]
