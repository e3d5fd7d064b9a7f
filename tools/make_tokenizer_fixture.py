#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/: a small byte-level BPE tokenizer.json (vocabulary 320 with
<|endoftext|>), trained once on the first 64 KiB of tinyshakespeare with the `tokenizers` package,
and expected.json: the ids that tokenizer gives (Tokenizer.encode, no special tokens added) for
the documents of tests/fixtures/tokenizer/docs.jsonl, for tests/test_data.sh's check of
scripts/make_shards.py --tokenizer.

    /work/wt/kernels/bench/.venv/bin/python tools/make_tokenizer_fixture.py
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizer")
TEXT = "/work/shared/data/tinyshakespeare.txt"
DOCS = ["First Citizen:\nBefore we proceed any further, hear me speak.",
        "All:\nSpeak, speak.",
        "ROMEO:\nIs the day so young? \u00e9t\u00e9 \u2014 unicode too."]


def main():
    os.makedirs(HERE, exist_ok=True)
    with open(TEXT, encoding="utf-8") as f:
        text = f.read(65536)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([text], trainer)
    tok.save(os.path.join(HERE, "tokenizer.json"))
    with open(os.path.join(HERE, "docs.jsonl"), "w", encoding="utf-8") as f:
        for d in DOCS:
            f.write(json.dumps({"body": d}) + "\n")
    ids = [tok.encode(d, add_special_tokens=False).ids for d in DOCS]
    eot = tok.token_to_id("<|endoftext|>")
    with open(os.path.join(HERE, "expected.json"), "w") as f:
        json.dump({"eot": eot, "vocab_size": tok.get_vocab_size(), "ids": ids}, f)
        f.write("\n")
    print(f"vocab {tok.get_vocab_size()}, eot {eot}, {sum(map(len, ids))} tokens for {len(DOCS)} documents")


if __name__ == "__main__":
    main()
