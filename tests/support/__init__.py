"""Helpers shared by the tests: brokers, crafted frames, models, scripts run as processes."""
