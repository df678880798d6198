"""`python -m jobplane.cli ...`, as the `jobplane` command."""

from jobplane.cli import main

if __name__ == "__main__":
    main()
