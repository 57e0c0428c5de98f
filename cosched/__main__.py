from cosched.entry import main

raise SystemExit(main())
