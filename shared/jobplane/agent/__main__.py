from jobplane.agent.cli import main

raise SystemExit(main())
