"""`python -m orchestrator` is the `orchestrator` command."""

from orchestrator.cli.main import main

raise SystemExit(main())
