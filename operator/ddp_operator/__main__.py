from ddp_operator.cli import main

raise SystemExit(main())
