"""The decode engine: one continuous-batching loop over one KV cache, for training and evaluation.

* :mod:`.kv_batch` -- rows decoded together over one cache: prefill without repeats, add, drop;
* :mod:`.sampling` -- TRL's sampling settings, one seeded stream per row, the sampled log-probs;
* :mod:`.decode` -- the loop (:func:`~.decode.decode`), its row state and the turn cache;
* :mod:`.turns` -- :func:`~.turns.generate_turns`, one model turn for many contexts (training).

The engine knows token ids, budgets and eos only: what happens between turns (parse a reply, run
its tools, append the tool turn) is the caller's ``end_turn``. It imports nothing of the tools.
"""
