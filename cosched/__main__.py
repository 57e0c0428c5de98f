"""``python -m cosched``: the ``cosched`` command, as the console script runs it."""
from cosched.entry import main

raise SystemExit(main())
