from cosched.cli import main

raise SystemExit(main())
