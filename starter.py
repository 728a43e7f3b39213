"""The starter CLI: `python starter.py --help`."""

from countersign.cli import main

if __name__ == "__main__":
    main()
