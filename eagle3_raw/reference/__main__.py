"""``python -m eagle3_raw.reference``: the reference server (options of ``eagle3-raw serve-reference``)."""

import sys

from eagle3_raw.reference.cli import main

sys.exit(main())
