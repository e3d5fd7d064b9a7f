/* Packed documents: many documents in one training sequence, each attending only to itself.
 *
 * A window of tokens is cut into documents at an end-of-text (EOT) token id: the EOT token ENDS
 * its document (it is the document's last token, as the tokenizer appended it), and the token after
 * it starts the next one. The window's first token starts a document even when the window begins
 * inside one (the part before the window is not seen), and the window's last document may be cut.
 *
 * For every token, pack_documents writes its document's START: the window position of the
 * document's first token. That one int is both the document id that attention compares (key
 * visible iff same start and not later) and what RoPE needs: the position inside the document is
 * position - start (transformers' position_ids of packed training restart at 0 the same way).
 *
 * Targets: the target of an EOT token is the first token of the NEXT document, which a separate
 * run of its document would never predict, so pack_mask_targets ignores it (-1): the loss and every
 * gradient equal running each document by itself (what transformers' DataCollatorWithFlattening
 * does with its -100 labels). This file only computes; it reads and writes no files. */
#ifndef SEQPAR_PACKING_H
#define SEQPAR_PACKING_H

/* doc_start (n) for tokens (n) split at eot; returns the number of documents (>= 1 if n > 0). */
int pack_documents(const int *tokens, int n, int eot, int *doc_start);

/* targets[i] = -1 where inputs[i] == eot; returns how many targets it ignored. */
int pack_mask_targets(const int *inputs, int n, int eot, int *targets);

/* Visible (query, key) pairs of causal document attention for the tokens at the given window
 * positions (pos, n) of a window whose document starts are doc_start: sum over the queries of the
 * keys of their document at or before them, i.e. pos - doc_start + 1 each (the work a rank owning
 * these queries does). Used for the layouts' balance figures. */
long long pack_visible_pairs(const int *doc_start, const int *pos, int n);

/* The sequence length that counts attention FLOPs for a window of n tokens with these document
 * starts: (sum over documents of length^2) / n, which is n for one document; under a sliding
 * attention window W > 0 (0: none) a document of m > W tokens counts W (2m - W) instead of m^2
 * (twice its visible pairs, as llama_window_length). The model's FLOPs per token
 * (llama_train_flops_lengths) take it in place of S, so that MFU counts only the attention packed
 * documents really compute (each token attends to its own document, within its window). */
double pack_attention_length(const int *doc_start, int n, int window);

#endif
