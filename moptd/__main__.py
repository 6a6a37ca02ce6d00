from moptd.cli import main

raise SystemExit(main())
