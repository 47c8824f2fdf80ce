"""Environments agents act in (text games); each returns text observations and rewards."""
