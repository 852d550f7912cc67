"""Servers eagle3_raw starts for a run: ``server.launch: sglang`` (a real SGLang server).

The parts: :mod:`.command` (the ``sglang.launch_server`` command line a recipe stands for, and the
flags it may not give), :mod:`.guard` (the watchdog process between eagle3_raw and the server:
the server never outlives its launcher, even one killed with SIGKILL), :mod:`.process` (start on
a free port, wait for ``/health`` with the log's tail on failure, stop), :mod:`.sglang` (the key
in a private file, the launch recorded in the set's manifest), :mod:`.held` (the server started
to learn the target is the one the run uses) and :mod:`.target` (the target of such a recipe).

The built-in reference server (``launch: reference``) is started by
:mod:`eagle3_raw.launching.reference`; the reference server also stands in for SGLang in the tests
(``server.sglang.executable: [python, -m, eagle3_raw.reference]``): same code path, same flags.
"""
