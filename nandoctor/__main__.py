"""`python -m nandoctor ...` is the same as `nandoctor ...`."""
from nandoctor.cli import main

if __name__ == "__main__":
    main()
