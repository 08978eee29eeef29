"""The worker registry's I/O: registration and discovery jobs (``service``), engine probes
(``probe``), the health checker (``health``) and the worker keys (``keys``)."""

from smgrl.registry.health import HealthChecker
from smgrl.registry.keys import KeyRing
from smgrl.registry.loads import LoadMonitor, monitoring_enabled
from smgrl.registry.probe import GATEWAY_ID_HEADER, ProbeFailed, ReachesSelf, fetch
from smgrl.registry.service import Registration, RegistryService

__all__ = [
    "GATEWAY_ID_HEADER",
    "HealthChecker",
    "KeyRing",
    "LoadMonitor",
    "ProbeFailed",
    "ReachesSelf",
    "Registration",
    "RegistryService",
    "fetch",
    "monitoring_enabled",
]
