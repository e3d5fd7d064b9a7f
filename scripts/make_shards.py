#!/usr/bin/env python3
"""Turns text files or JSONL into llm.c token shards for `seqpar train --data DIR`.

Each input document (a whole .txt file or each of its paragraphs with --txt-split, or the text field of each JSONL line) is tokenized with a
Hugging Face tokenizer.json given by path (nothing is downloaded) and preceded by the end-of-text
token, as llm.c's data scripts do, so documents are separated by it. Tokens are written in order
to shards of --shard-size tokens: the first --val-tokens tokens (whole documents) to
NAME_val_000000.bin, the rest to NAME_train_000000.bin, NAME_train_000001.bin, ... Each shard is
llm.c's format: a 256 x int32 header (magic 20240520, version 1, token count) then uint16 tokens,
or magic 20240801, version 7 and uint32 tokens when the vocabulary exceeds 65536 ids.

--byte-level needs no tokenizer: each UTF-8 byte is a token (0..255) and the end-of-text token is
256 (vocabulary 257). --encode TEXT / --decode IDS print one text's token ids (comma-separated) or
the text of ids, for `seqpar sample --prompt-tokens`.

The `tokenizers` package (PyPI) is needed for --tokenizer; if it is missing, `--setup` makes a
virtual environment with it under ~/.cache/seqpar (or $SEQPAR_CACHE) and later runs use it.
Only the Python standard library is needed otherwise.
"""
import argparse
import array
import glob
import json
import os
import subprocess
import sys

MAGIC_U16, VERSION_U16 = 20240520, 1
MAGIC_U32, VERSION_U32 = 20240801, 7
BYTE_EOT = 256
EOT_CANDIDATES = ["<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "[SEP]"]


def fail(msg):
    print(f"make_shards.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def cache_venv():
    root = os.environ.get("SEQPAR_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "seqpar")
    return os.path.join(root, "tokenize-venv")


def venv_python():
    return os.path.join(cache_venv(), "bin", "python")


def setup_venv():
    """Creates the cache venv with `tokenizers` from PyPI (the only network use, on request)."""
    venv = cache_venv()
    if not os.path.exists(venv_python()):
        print(f"make_shards.py: creating {venv}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    subprocess.run([venv_python(), "-m", "pip", "install", "--quiet", "tokenizers"], check=True)
    print(f"make_shards.py: 'tokenizers' is installed in {venv}; later runs use it", file=sys.stderr)


def import_tokenizers():
    try:
        import tokenizers  # noqa: F401
        return tokenizers
    except ImportError:
        pass
    # a venv made by --setup: run this script again with its python
    if os.path.exists(venv_python()) and os.path.realpath(sys.executable) != os.path.realpath(venv_python()):
        os.execv(venv_python(), [venv_python()] + sys.argv)
    fail(f"the Python package 'tokenizers' is missing: run 'python3 scripts/make_shards.py --setup' once (a venv "
         f"in {cache_venv()}, from PyPI), or 'pip install tokenizers', or use --byte-level")


class ByteLevel:
    """UTF-8 bytes as tokens 0..255, end-of-text 256."""
    vocab_size = BYTE_EOT + 1

    def encode_batch(self, texts):
        return [list(t.encode("utf-8")) for t in texts]

    def decode(self, ids):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path):
        tokenizers = import_tokenizers()
        if not os.path.isfile(path):
            fail(f"tokenizer file '{path}' does not exist: pass the tokenizer.json of your model "
                 "(nothing is downloaded)")
        try:
            self.tok = tokenizers.Tokenizer.from_file(path)
        except Exception as exc:  # the package reports many kinds of parse errors
            fail(f"'{path}' is not a Hugging Face tokenizer.json: {str(exc).splitlines()[0]}")
        self.vocab_size = self.tok.get_vocab_size(with_added_tokens=True)

    def encode_batch(self, texts):
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def eot_id(self, token):
        if token is not None:
            i = self.tok.token_to_id(token)
            if i is None:
                fail(f"the tokenizer has no token '{token}': pass one it has to --eot-token, or an id to --eot")
            return i
        for t in EOT_CANDIDATES:
            i = self.tok.token_to_id(t)
            if i is not None:
                return i
        fail("the tokenizer has none of the usual end-of-text tokens (" + ", ".join(EOT_CANDIDATES) +
             "): name one with --eot-token or give its id with --eot")


def documents(paths, field, txt_split):
    """Yields each document's text: a .txt file whole (or each of its paragraphs or lines, by
    txt_split), each line of a .jsonl/.json file's `field`."""
    for path in paths:
        if not os.path.isfile(path):
            fail(f"input '{path}' does not exist or is not a file")
        if path.endswith(".jsonl") or path.endswith(".json"):
            with open(path, "rb") as f:
                for n, raw in enumerate(f, 1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        fail(f"{path}:{n} is not UTF-8 text ({exc.reason} at byte {exc.start} of the line)")
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as exc:
                        fail(f"{path}:{n} is not a JSON object ({exc.msg}): each line of a JSONL file must be one")
                    if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
                        fail(f"{path}:{n} has no string field '{field}': name the text field with --text-field")
                    yield obj[field]
        else:
            with open(path, encoding="utf-8", errors="strict") as f:
                try:
                    text = f.read()
                except UnicodeDecodeError as exc:
                    fail(f"'{path}' is not UTF-8 text ({exc.reason} at byte {exc.start})")
            if txt_split == "file":
                yield text
            else:
                for part in text.split("\n\n" if txt_split == "paragraph" else "\n"):
                    if part.strip():
                        yield part


class ShardWriter:
    """Writes shards into out_dir, made at the first shard; remove() takes back everything it made
    (a failed run leaves no half-made set of shards, nor an empty directory)."""

    def __init__(self, out_dir, name, shard_size, vocab_size):
        self.out_dir, self.name, self.shard_size = out_dir, name, shard_size
        self.wide = vocab_size > 65536
        self.written = []
        self.made_dir = False

    def remove(self):
        for p, _ in self.written:
            if os.path.exists(p):
                os.remove(p)
        self.written = []
        if self.made_dir and not os.listdir(self.out_dir):
            os.rmdir(self.out_dir)

    def write(self, kind, index, tokens):
        if not os.path.isdir(self.out_dir):
            try:
                os.makedirs(self.out_dir)
            except OSError as exc:
                fail(f"cannot make --out directory '{self.out_dir}': {exc.strerror}")
            self.made_dir = True
        path = os.path.join(self.out_dir, f"{self.name}_{kind}_{index:06d}.bin")
        header = array.array("i", [0] * 256)
        header[0], header[1] = (MAGIC_U32, VERSION_U32) if self.wide else (MAGIC_U16, VERSION_U16)
        header[2] = len(tokens)
        body = array.array("I" if self.wide else "H", tokens)
        if sys.byteorder != "little":
            header.byteswap()
            body.byteswap()
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(header.tobytes())
                f.write(body.tobytes())
            os.replace(tmp, path)
        except OSError as exc:  # a full disk, a read-only directory
            if os.path.exists(tmp):
                os.remove(tmp)
            fail(f"writing '{path}' failed: {exc.strerror}")
        self.written.append((path, len(tokens)))


def parse_ids(text, vocab_size):
    try:
        ids = [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        fail(f"--decode expects token ids separated by commas, got '{text}'")
    for i in ids:
        if not 0 <= i < vocab_size:  # dropped without a word (bytes) or an exception (tokenizers)
            fail(f"--decode: id {i} is outside the vocabulary (0..{vocab_size - 1}): give ids of this tokenizer")
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="*", help=".txt files (one document each) and .jsonl files (one per line)")
    ap.add_argument("--tokenizer", help="a Hugging Face tokenizer.json (needs the 'tokenizers' package)")
    ap.add_argument("--byte-level", action="store_true", help="UTF-8 bytes as tokens, end-of-text 256")
    ap.add_argument("--out", help="output directory (created)")
    ap.add_argument("--name", default="data", help="shard name prefix (default: data)")
    ap.add_argument("--text-field", default="text", help="the JSONL field holding the text (default: text)")
    ap.add_argument("--txt-split", choices=["file", "paragraph", "line"], default="file",
                    help="a .txt file is one document (default), or one per blank-line paragraph, or per line")
    ap.add_argument("--eot", type=int, help="end-of-text token id")
    ap.add_argument("--eot-token", help="end-of-text token string (default: the first of " +
                    ", ".join(EOT_CANDIDATES) + " the tokenizer has)")
    ap.add_argument("--shard-size", type=int, default=100_000_000, help="tokens per shard (default 1e8, as llm.c)")
    ap.add_argument("--val-tokens", type=int, default=1_000_000,
                    help="tokens of whole documents, from the start, for the _val_ shard (default 1e6; 0: none)")
    ap.add_argument("--encode", metavar="TEXT", help="print TEXT's token ids, comma-separated, and exit")
    ap.add_argument("--decode", metavar="IDS", help="print the text of comma-separated token ids and exit")
    ap.add_argument("--setup", action="store_true", help="make a venv with 'tokenizers' under ~/.cache/seqpar")
    a = ap.parse_args()

    if a.setup:
        setup_venv()
        if not a.inputs and a.encode is None and a.decode is None:
            return
        os.execv(venv_python(), [venv_python()] + [x for x in sys.argv if x != "--setup"])
    if bool(a.tokenizer) == bool(a.byte_level):
        fail("give exactly one of --tokenizer tokenizer.json and --byte-level")
    tok = HFTokenizer(a.tokenizer) if a.tokenizer else ByteLevel()
    if a.encode is not None:
        print(",".join(str(i) for i in tok.encode_batch([a.encode])[0]))
        return
    if a.decode is not None:
        sys.stdout.write(tok.decode(parse_ids(a.decode, tok.vocab_size)))
        return
    if not a.inputs:
        fail("no input files: name .txt or .jsonl files to tokenize")
    if not a.out:
        fail("no output directory: give --out DIR")
    if a.shard_size < 1 or a.val_tokens < 0:
        fail("--shard-size must be at least 1 and --val-tokens at least 0")
    if a.eot is not None:
        eot = a.eot
    else:
        eot = BYTE_EOT if a.byte_level else tok.eot_id(a.eot_token)
    if not 0 <= eot < max(tok.vocab_size, 1) or eot >= 2**31 - 1:
        fail(f"--eot {eot} is outside the vocabulary (0..{tok.vocab_size - 1})")
    if not a.name or "/" in a.name or a.name in (".", ".."):
        fail(f"--name '{a.name}' must be a file name prefix (no '/'): the shards go into --out")
    if "_val_" in a.name or "_train_" in a.name:
        fail(f"--name '{a.name}' holds '_val_' or '_train_', which seqpar reads as the shard's role: choose another")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        fail(f"--out '{a.out}' exists and is not a directory: give a directory (it is created)")
    if os.path.isdir(a.out):  # `seqpar train --data DIR` reads every .bin file in it, old ones too
        old = sorted(f for f in os.listdir(a.out) if f.endswith(".bin"))
        if old:
            fail(f"--out '{a.out}' already holds {len(old)} .bin file(s) ({', '.join(old[:3])}{', ...' if len(old) > 3 else ''}), "
                 "which seqpar would read with the new shards: give an empty directory or remove them")
    w = ShardWriter(a.out, a.name, a.shard_size, tok.vocab_size)
    try:
        write_shards(a, tok, eot, w)
    except SystemExit:
        w.remove()
        raise


def write_shards(a, tok, eot, w):
    val, train, train_index, n_docs = [], [], 0, 0
    in_val = a.val_tokens > 0
    batch = []

    def flush(texts):
        nonlocal val, train, train_index, in_val, n_docs
        for ids in tok.encode_batch(texts):
            n_docs += 1
            doc = [eot] + ids
            if in_val:
                val.extend(doc)
                if len(val) >= a.val_tokens:
                    in_val = False
                    for i in range(0, len(val), a.shard_size):  # a val set larger than a shard
                        w.write("val", i // a.shard_size, val[i:i + a.shard_size])
                    val = []
                continue
            train.extend(doc)
            while len(train) >= a.shard_size:
                w.write("train", train_index, train[:a.shard_size])
                train = train[a.shard_size:]
                train_index += 1

    for text in documents(a.inputs, a.text_field, a.txt_split):
        batch.append(text)
        if len(batch) == 256:
            flush(batch)
            batch = []
    flush(batch)
    if in_val:
        fail(f"all {len(val)} tokens ({n_docs} documents) went to validation (--val-tokens {a.val_tokens}): "
             "give more text or a smaller --val-tokens")
    if train:
        w.write("train", train_index, train)
    if not any(p.endswith(".bin") and "_train_" in os.path.basename(p) for p, _ in w.written):
        fail(f"no training tokens: the {n_docs} documents fill only the validation shard; lower --val-tokens")
    total = sum(n for _, n in w.written)
    print(f"make_shards.py: {n_docs} documents, {total} tokens (end-of-text {eot}, vocabulary {tok.vocab_size}) "
          f"in {len(w.written)} shards under {a.out}:")
    for p, n in w.written:
        print(f"  {p}  {n} tokens")


if __name__ == "__main__":
    main()
