"""`python3 -m tritonstack.launcher [prepare|llm] [tritonserver arguments...]`."""

from tritonstack.launcher.start import main

raise SystemExit(main())
