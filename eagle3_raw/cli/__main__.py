"""``python -m eagle3_raw.cli``: the ``eagle3-raw`` command."""

from eagle3_raw.cli.main import main

raise SystemExit(main())
