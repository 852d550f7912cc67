"""Servers eagle3_raw starts for a run: ``server.launch: sglang`` or ``vllm`` (a real engine).

The parts: :mod:`.sections` (which engine a recipe launches, from which section, and that engine's
launch digest and start), :mod:`.guard` (the watchdog process between eagle3_raw and the server:
the server never outlives its launcher, even one killed with SIGKILL), :mod:`.process` (start on
a free port, wait for ``/health`` with the log's tail on failure, stop), :mod:`.sglang` and
:mod:`.vllm` (each engine's start: SGLang's key in a private file, vLLM's in its environment),
:mod:`.records` (the launch recorded in the set's manifest), :mod:`.held` (the server started to
learn the target is the one the run uses) and :mod:`.target` (the target of such a recipe). The
command lines and the flags a recipe may not give are the engines' own:
:mod:`eagle3_raw.sglang.launch`, :mod:`eagle3_raw.vllm.launch`.

The built-in reference server (``launch: reference``) is started by
:mod:`eagle3_raw.launching.reference`; the reference server also stands in for SGLang in the tests
(``server.sglang.executable: [python, -m, eagle3_raw.reference]``): same code path, same flags.
"""
