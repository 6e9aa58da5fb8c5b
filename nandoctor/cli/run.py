"""`nandoctor run`: placeholder until the runner lands."""
from nandoctor.cli import app
