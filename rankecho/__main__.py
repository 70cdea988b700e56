from rankecho.cli import main

raise SystemExit(main())
