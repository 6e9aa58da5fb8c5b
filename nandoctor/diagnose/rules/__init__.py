"""Importing this package registers every rule (see `nandoctor.diagnose.registry`)."""
from nandoctor.diagnose.rules import context, fallback, ops  # noqa: F401
