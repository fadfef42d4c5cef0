"""Migrations of results written by older versions (``clipcache results migrate``)."""
