"""`python -m orchestrator` is the `orchestrator` command."""

from .cli.main import main

raise SystemExit(main())
