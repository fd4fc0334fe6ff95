import torch

from engines.builtin.speculative.eagle3.proposer import Eagle3Proposer
from engines.builtin.speculative.proposer import DraftInput
from tests.engines.eagle3.conftest import DRAFT_VOCAB, HIDDEN, VOCAB, random_head
from training.eagle3.dataset import Conversation, collate
from training.eagle3.ttt import unrolled_loss

N = 24
TOKENS = torch.randint(0, VOCAB, (N + 1,), generator=torch.Generator().manual_seed(1)).tolist()
HIDDEN_ROWS = torch.randn(N, 3 * HIDDEN, generator=torch.Generator().manual_seed(2))


def item(seq_id, n, num_drafts, start, end=None):
    # committed tokens 0..n; hidden states of positions start..end-1 (end defaults to n)
    end = n if end is None else end
    return DraftInput(seq_id, TOKENS[: n + 1], num_drafts, HIDDEN_ROWS[start:end], start)


def test_drafts_respect_num_drafts_and_come_from_the_draft_vocabulary(head):
    proposer = Eagle3Proposer(head)
    for k in range(5):
        drafts = proposer.propose([item(f"s{k}", 10, k, 0)])[0]
        assert len(drafts) == k
        assert all(d in DRAFT_VOCAB.tolist() for d in drafts)


def test_batch_answers_each_sequence_in_order(head):
    proposer = Eagle3Proposer(head)
    together = proposer.propose([item("a", 10, 3, 0), item("b", 15, 2, 0)])
    alone = Eagle3Proposer(random_head()).propose([item("b", 15, 2, 0)])
    assert [len(d) for d in together] == [3, 2]
    assert together[1] == alone[0]


def test_incremental_hidden_states_match_one_shot(head):
    one_shot = Eagle3Proposer(head).propose([item("s", 20, 4, 0)])[0]
    proposer = Eagle3Proposer(random_head())
    proposer.propose([item("s", 8, 2, 0)])
    proposer.propose([item("s", 15, 2, 8)])
    assert proposer.propose([item("s", 20, 4, 15)])[0] == one_shot


def test_hidden_start_rewinds_the_cache(head):
    """After a rejection (or a preemption) the engine gives positions again from an earlier start."""
    reference = Eagle3Proposer(random_head()).propose([item("s", 12, 4, 0)])[0]
    proposer = Eagle3Proposer(head)
    proposer.propose([item("s", 18, 4, 0)])
    assert proposer.caches["s"].end == 18
    rewound = proposer.propose([item("s", 12, 4, 6)])[0]  # positions 6..11 again; 12..17 dropped
    assert proposer.caches["s"].end == 12
    assert rewound == reference
    assert proposer.propose([item("s", 12, 4, 0)])[0] == reference  # from 0: a fresh start


def test_finish_frees_the_sequence(head):
    proposer = Eagle3Proposer(head)
    proposer.propose([item("a", 10, 2, 0), item("b", 10, 2, 0)])
    proposer.finish("a")
    assert set(proposer.caches) == {"b"}
    proposer.finish("unknown")  # forgetting twice, or a sequence never seen, is fine
    assert proposer.propose([DraftInput("a", TOKENS[:11], 2)])[0] == []  # no hidden states: no drafts


def test_zero_drafts_still_ingests_hidden_states(head):
    proposer = Eagle3Proposer(head)
    assert proposer.propose([item("s", 10, 0, 0)]) == [[]]
    assert proposer.caches["s"].end == 10


def test_first_draft_matches_the_training_forward(head):
    """Inference (per-sequence cache) and training (packed, masked) compute the same step 0."""
    conv = Conversation(torch.tensor(TOKENS[:N]), 0, HIDDEN_ROWS.to(torch.bfloat16), torch.zeros(N, HIDDEN, dtype=torch.bfloat16))
    batch = collate([conv], N)
    logits = {}
    orig = head.logits
    head.logits = lambda out: logits.setdefault(len(logits), orig(out))  # capture step-0 logits
    unrolled_loss(head, batch, torch.full((N, len(DRAFT_VOCAB)), 1 / len(DRAFT_VOCAB)), num_steps=1)
    head.logits = orig
    expected = head.to_target(logits[0].argmax(-1))  # step 0 rows t = 0..N-3 draft token t + 2
    proposer = Eagle3Proposer(head)
    for n in range(1, N - 1):  # committed 0..n, hidden of positions < n: the row n - 1 draft
        hidden_bf16 = HIDDEN_ROWS.to(torch.bfloat16).float()
        draft = proposer.propose([DraftInput("s", TOKENS[: n + 1], 1, hidden_bf16[n - 1 : n], n - 1)])[0]
        assert draft == [int(expected[n - 1])], n


def test_a_hidden_row_without_its_next_token_is_not_ingested(head):
    proposer = Eagle3Proposer(head)
    drafts = proposer.propose([DraftInput("s", TOKENS[:10], 2, HIDDEN_ROWS[:10], 0)])[0]  # row 9 has no token 10 yet
    assert proposer.caches["s"].end == 9
    assert drafts == Eagle3Proposer(random_head()).propose([item("s", 9, 2, 0)])[0]
