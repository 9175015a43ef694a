"""Notifications: the outbox that reads the trail, the notices it makes, and their delivery as jobs."""
