import torch

from engines.builtin.loader.random import random_weights
from engines.builtin.runner.weights import LlamaWeights
from tests.engines.eagle3.conftest import TINY_TARGET, VOCAB
from training.eagle3.dataset import Conversation, collate, draft_vocab, pack, token_counts
from training.eagle3.features import target_features
from training.eagle3.train import TargetParts, TrainConfig, initial_head, train_head
from training.eagle3.ttt import target_probs, unrolled_loss

AUX = (0, 1, 2)


def tiny_data() -> tuple[TargetParts, list[Conversation]]:
    weights = LlamaWeights.from_state_dict(random_weights(TINY_TARGET, 0, torch.device("cpu"), torch.float32), TINY_TARGET)
    rng = torch.Generator().manual_seed(0)
    conversations = []
    for _ in range(6):  # a prompt, then an answer that follows a fixed rule the head can learn
        prompt = torch.randint(0, VOCAB, (8,), generator=rng).tolist()
        answer = [(prompt[-1] * 5 + 7 * i) % VOCAB for i in range(40)]
        ids = prompt + answer
        aux, last = target_features(weights, TINY_TARGET, ids, AUX)
        conversations.append(Conversation(torch.tensor(ids), len(prompt), aux.to(torch.bfloat16), last.to(torch.bfloat16)))
    # a random model's distribution is nearly uniform (nothing to learn); a sharper final norm makes it peaked
    target = TargetParts(TINY_TARGET, weights.embed, weights.norm * 30, weights.lm_head)
    return target, conversations


def mean_loss(head, target, conversations, vocab):
    batch = collate(conversations, 512)
    probs = target_probs(batch, target.norm, target.lm_head[vocab], TINY_TARGET.rms_norm_eps)
    with torch.no_grad():
        loss, stats = unrolled_loss(head, batch, probs, num_steps=3)
    return float(loss), stats


def test_a_few_training_steps_lower_the_unrolled_loss(tmp_path):
    target, conversations = tiny_data()
    config = TrainConfig(draft_vocab_size=48, num_epochs=6, batch_tokens=96, lr=3e-3, warmup_steps=2, save_every=10)
    vocab = draft_vocab(token_counts(conversations, VOCAB), config.draft_vocab_size)
    before, stats = mean_loss(initial_head(conversations, target, AUX, config), target, conversations, vocab)
    assert len(stats) == 3  # one entry per unrolled step
    head = train_head(conversations, target, AUX, config, tmp_path / "state.pt")
    after, _ = mean_loss(head, target, conversations, vocab)
    assert after < 0.8 * before, (before, after)
    assert (tmp_path / "state.pt").exists()  # resumable state was saved along the way


def test_draft_vocab_takes_the_most_frequent_answer_tokens_sorted():
    ids = torch.tensor([5, 5, 5, 9, 9, 1, 2, 2, 2, 2])
    conv = Conversation(ids, 3, torch.zeros(10, 3), torch.zeros(10, 1))  # prompt 5 5 5 is not counted
    assert draft_vocab(token_counts([conv], 12), 2).tolist() == [2, 9]


def test_pack_keeps_batches_under_the_token_budget():
    convs = [Conversation(torch.zeros(n, dtype=torch.long), 1, torch.zeros(n, 3), torch.zeros(n, 1)) for n in (30, 50, 40, 90)]
    groups = pack(convs, 100)
    assert sum(len(g) for g in groups) == 4
    assert all(sum(min(len(c.token_ids), 100) for c in g) <= 100 for g in groups)
