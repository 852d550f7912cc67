"""``eagle3-raw eval``: a set's prompts replayed through speculating servers, and how well each
server's drafter did on them.

The stages, one module each: :mod:`.sets` (a recipe's built split, opened without generating,
and its replay points: the prompt ids exactly as the set holds them, each row's
``max_new_tokens``, its sampling), :mod:`.replay` (the points sent to one server's native
``/generate`` through :mod:`eagle3_raw.sglang.client`, bounded in flight, retried, each answer
checked), :mod:`.report` (the answers summarized with :func:`eagle3_raw.acceptance.summarize`,
generation speed beside them, as JSON and as a table) and :mod:`.plot` (the card's acceptance
plot, :mod:`eagle3_raw.plots`, one colour per server).

What is measured is the server's own account of its speculation: SGLang's ``meta_info``
``spec_*`` figures for each request, summed over requests (an accept length is generated tokens
over verify steps of all the requests of a group, not a mean of per-request lengths).
"""
