"""`minimind_trl.engine.kv_batch`: prompts encoded once into one padded KV cache, rows added and
dropped, must give the next-token logits of a plain forward pass over each row alone."""

import pytest
import torch

from minimind_trl.engine.kv_batch import (
    GrowingLayer,
    KVBatch,
    cache_tensors,
    compact,
    length_groups,
    merge,
    prefill,
    prefix_clusters,
    shared_prefix_length,
)

PAD = 0


@pytest.fixture
def model(make_tiny_model):
    sharp = make_tiny_model(seed=3)
    with torch.no_grad():  # large weights: logits that depend strongly on the context
        for parameter in sharp.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.2)
    return sharp


class FedTokens:
    """Counts the token positions (pads included) every forward computes."""

    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        self.count += kwargs["input_ids"].numel()


def next_logits(model, batch: KVBatch) -> torch.Tensor:
    """Logits [B, V] after feeding the pending columns, positions from the mask."""
    positions = (batch.mask.cumsum(-1) - 1).clamp(min=0)[:, batch.cached:]
    with torch.no_grad():
        out = model(input_ids=batch.ids[:, batch.cached:], attention_mask=batch.mask,
                    position_ids=positions, cache=batch.cache, use_cache=True)
    return out.logits[:, -1]


def plain_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def prompts_with(prefix: list[int], tails: list[list[int]]) -> list[list[int]]:
    return [prefix + tail for tail in tails]


PREFIX = [1, 40, 41, 42, 43, 44]
TAIL_A = list(range(100, 110))  # 10 tokens
TAIL_B = list(range(200, 210))  # 10 tokens
TAIL_C = [300, 301, 302]  # 3 tokens
TAIL_D = list(range(400, 409))  # 9 tokens


def test_prefill_encodes_each_distinct_prompt_once_and_matches_plain_forward(model):
    a, b, c, d = prompts_with(PREFIX, [TAIL_A, TAIL_B, TAIL_C, TAIL_D])
    prompts = [a, b, a, c, b, d, a]
    fed = FedTokens(model)
    with torch.no_grad():
        batch = prefill(model, prompts, PAD)
    fed.handle.remove()
    # Shared prefix once; tails minus their last token: A, B and D in one group (D padded by
    # one: 1 of 27 positions), C alone (in that group 7 of 36 positions would be pads > 1/8).
    assert fed.count == len(PREFIX) + 3 * 9 + 1 * 2
    assert batch.pending == 1 and batch.ids.shape == (7, len(PREFIX) + 10)
    assert batch.cache.get_seq_length() == batch.cached == len(PREFIX) + 9
    for row, prompt in enumerate(prompts):  # left-padded rows
        assert batch.ids[row][batch.mask[row].bool()].tolist() == prompt
    logits = next_logits(model, batch)
    for row, prompt in enumerate(prompts):
        torch.testing.assert_close(logits[row], plain_logits(model, prompt), atol=1e-4, rtol=1e-4)


HEAD = list(range(600, 640))  # 40 tokens: a system turn and tool list some prompts share


def test_prefill_encodes_a_cluster_prefix_once(model):
    cluster = prompts_with(PREFIX + HEAD, [[700, 701, 702, 703, 704], [710, 711, 712, 713, 714], [720, 721, 722]])
    loose = prompts_with(PREFIX, [TAIL_A, TAIL_C])
    prompts = [cluster[0], loose[0], cluster[1], loose[1], cluster[2], cluster[0]]
    assert prefix_clusters([list(p) for p in dict.fromkeys(map(tuple, prompts))], len(PREFIX)) == [
        ([0, 2, 4], len(PREFIX) + 40), ([1, 3], len(PREFIX))]  # clusters, then the loose prompts
    fed = FedTokens(model)
    with torch.no_grad():
        batch = prefill(model, prompts, PAD)
    fed.handle.remove()
    # PREFIX once; HEAD once; the cluster's tails minus their last token (4 + 4 together, 2
    # alone); the loose prompts' tails after PREFIX (9, 2: apart, too different in length).
    assert fed.count == len(PREFIX) + 40 + 2 * 4 + 2 + 9 + 2
    for row, prompt in enumerate(prompts):
        assert batch.ids[row][batch.mask[row].bool()].tolist() == prompt
    for logits, prompt in zip(next_logits(model, batch), prompts):
        torch.testing.assert_close(logits, plain_logits(model, prompt), atol=1e-4, rtol=1e-4)


def test_prefill_of_one_repeated_prompt_and_of_prompts_without_shared_prefix(model):
    prompt = PREFIX + TAIL_A
    batch = prefill(model, [prompt] * 3, PAD)  # only the prefix step: all but one token shared
    assert batch.cached == len(prompt) - 1 and not (batch.mask == 0).any()
    for logits in next_logits(model, batch):
        torch.testing.assert_close(logits, plain_logits(model, prompt), atol=1e-4, rtol=1e-4)
    different = [[5] + TAIL_A, [6] + TAIL_D, [7] + TAIL_C]  # nothing shared; pads come first
    batch = prefill(model, different, PAD)
    for logits, ids in zip(next_logits(model, batch), different):
        torch.testing.assert_close(logits, plain_logits(model, ids), atol=1e-4, rtol=1e-4)


def test_merge_widens_cached_and_pending_columns(model):
    a, b, c = prompts_with(PREFIX, [TAIL_A, TAIL_B, TAIL_C])
    with torch.no_grad():
        first = prefill(model, [a, c], PAD)
        # Two rows that have more to feed than their last prompt token (a tool turn, say): one
        # with three extra tokens, one with one extra token after a pad inside the pending part.
        second = prefill(model, [b[:-4], c], PAD)
    extra = torch.tensor([[500, 501, 502], [PAD, PAD, 503]])
    second = KVBatch(torch.cat([second.ids, extra], 1),
                     torch.cat([second.mask, torch.tensor([[1, 1, 1], [0, 0, 1]])], 1),
                     second.cache, second.pending + 3)
    merged = merge(model, [first, second], PAD)
    assert merged.pending == 4 and merged.cached == max(first.cached, second.cached)
    assert merged.cache.get_seq_length() == merged.cached
    expected = [a, c, b[:-4] + [500, 501, 502], c + [503]]
    for row, ids in enumerate(expected):
        assert merged.ids[row][merged.mask[row].bool()].tolist() == ids
    for logits, ids in zip(next_logits(model, merged), expected):
        torch.testing.assert_close(logits, plain_logits(model, ids), atol=1e-4, rtol=1e-4)


def test_merging_many_batches_at_once_equals_merging_two_at_a_time(model):
    """One join of several batches (a cached one, a resumed row with a tool turn pending, a batch
    with nothing cached) gives the columns and cache, bit for bit, of joining them pairwise."""
    a, b, c = prompts_with(PREFIX, [TAIL_A, TAIL_B, TAIL_C])
    with torch.no_grad():
        first = prefill(model, [a, c], PAD)
        second = prefill(model, [b[:-2]], PAD)
        second = KVBatch(torch.cat([second.ids, torch.tensor([[600, 601]])], 1),
                         torch.cat([second.mask, torch.ones(1, 2, dtype=torch.long)], 1), second.cache,
                         second.pending + 2)
        third = prefill(model, [[7]], PAD)  # one token: nothing cached
    at_once = merge(model, [first, second, third], PAD)
    pairwise = merge(model, [merge(model, [first, second], PAD), third], PAD)
    assert (at_once.cached, at_once.pending) == (pairwise.cached, pairwise.pending) == (first.cached, 3)
    assert torch.equal(at_once.ids, pairwise.ids) and torch.equal(at_once.mask, pairwise.mask)
    for (k1, v1), (k2, v2) in zip(cache_tensors(at_once.cache), cache_tensors(pairwise.cache)):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
    expected = [a, c, b[:-2] + [600, 601], [7]]
    for logits, ids in zip(next_logits(model, at_once), expected):
        torch.testing.assert_close(logits, plain_logits(model, ids), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="no batches"):
        merge(model, [], PAD)


def feed(model, batch: KVBatch, ids: list[list[int]], mask: list[list[int]]) -> KVBatch:
    """Run the pending columns through the model (into the cache); ``ids`` become pending."""
    next_logits(model, batch)
    return KVBatch(torch.cat([batch.ids, torch.tensor(ids)], 1), torch.cat([batch.mask, torch.tensor(mask)], 1),
                   batch.cache, len(ids[0]))


def test_compact_drops_pads_inside_the_cache(model):
    a, c = prompts_with(PREFIX, [TAIL_A, TAIL_C])
    batch = prefill(model, [a, c], PAD)
    # Row 0 waits (pads) while row 1 appends three tokens, twice: pads inside row 0's cache.
    batch = feed(model, batch, [[PAD, PAD, 500], [501, 502, 503]], [[0, 0, 1], [1, 1, 1]])
    batch = feed(model, batch, [[PAD, PAD, 504], [505, 506, 507]], [[0, 0, 1], [1, 1, 1]])
    batch = feed(model, batch, [[508], [509]], [[1], [1]])
    expected = [a + [500, 504, 508], c + [501, 502, 503, 505, 506, 507, 509]]
    assert compact(batch, slack=1.0) is batch  # within the slack: left alone
    packed = compact(batch, slack=0.0)
    longest = max(len(ids) for ids in expected) - 1  # the last token of each row is pending
    assert packed.cached == packed.cache.get_seq_length() == longest < batch.cached
    for row, ids in enumerate(expected):
        assert packed.ids[row][packed.mask[row].bool()].tolist() == ids
    for logits, ids in zip(next_logits(model, packed), expected):
        torch.testing.assert_close(logits, plain_logits(model, ids), atol=1e-4, rtol=1e-4)


def test_growing_layer_appends_in_place_and_matches_concatenation():
    layer = GrowingLayer()
    chunks = [torch.randn(2, 3, n, 4) for n in (5, 1, 1, 200, 1)]
    for i, chunk in enumerate(chunks):
        keys, values = layer.update(chunk, -chunk)
        expected = torch.cat(chunks[:i + 1], dim=2)
        assert torch.equal(keys, expected) and torch.equal(values, -expected)
        assert layer.get_seq_length() == expected.shape[2]
    storage = layer.keys.untyped_storage().data_ptr()
    layer.update(chunks[1], chunks[1])  # room to spare: written in place, no new buffer
    assert layer.keys.untyped_storage().data_ptr() == storage
    layer.batch_select_indices(torch.tensor([1]))  # whole-cache edits go through the setters
    assert layer.keys.shape == (1, 3, 209, 4) and torch.equal(layer.keys[0, :, :5], chunks[0][1])


def test_length_groups_bound_padding_and_size():
    lengths = [100, 98, 97, 60, 59, 10, 100, 9]
    groups = length_groups(lengths, max_pad_fraction=0.125, max_tokens=250)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:
        longest = max(lengths[i] for i in group)
        assert lengths[group[0]] == longest
        pads = len(group) * longest - sum(lengths[i] for i in group)
        assert pads <= 0.125 * len(group) * longest
        assert len(group) * longest <= 250 or len(group) == 1
    assert groups == [[0, 6], [1, 2], [3, 4], [5, 7]]


def test_shared_prefix_length_leaves_one_token_of_each_prompt():
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2], [7, 2]]) == 0
