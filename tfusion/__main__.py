"""Allows `python -m tfusion`."""

from tfusion.cli import main

raise SystemExit(main())
