"""`nandoctor check-data`: being built (issue 5)."""
from __future__ import annotations

from nandoctor.cli import app
