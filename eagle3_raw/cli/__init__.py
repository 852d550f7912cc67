"""The ``eagle3-raw`` command line: :mod:`~eagle3_raw.cli.main` parses and dispatches, one module per
command family over the helpers it shares."""
