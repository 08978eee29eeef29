"""Settings every test module shares."""

from hypothesis import HealthCheck, settings

# Property tests are judged by the examples they run, not by how fast they were drawn: on a busy
# machine (the suite runs its files in parallel) generation and each example take longer, and a
# health check or deadline on time would fail a property that holds. Each test's own @settings
# (max_examples) still applies on top of this profile.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")
