/*
 * calib/eval/tasks.h — zero-shot accuracy of a causal LM on six standard tasks (HellaSwag, ARC-Easy,
 * ARC-Challenge, PIQA, WinoGrande, LAMBADA), under two scoring protocols: lm-evaluation-harness's and
 * llama.cpp's llama-perplexity's. The entry for callers (`llmq eval --tasks`, `llmq compare`) is
 * llmq_tasks_run: a model, a task list and options in, one result per task out.
 *
 * What it is: the task readers (file formats below), the request strings of each protocol, the
 * tokenization and the choice of scored positions, the batched forward passes (calib/model/forward.h
 * block API), the scoring, the statistics. What it is not: no printing (cli/cmd_eval.c), no dataset
 * lookup policy beyond datasets/datasets.h (a task is a manifest name or a file).
 *
 * Legend: C choices of an item (2..LLMQ_TASK_MAX_CHOICES), V n_vocab, D n_embd.
 *
 * ---- Task files (what the readers accept; every error names the file and the line) --------------------
 *   hellaswag   llama.cpp's 6-line text format (tools/perplexity/perplexity.cpp hellaswag_score): per
 *               item the context "activity_label: ctx", the gold ending 0..3, the four endings; the
 *               line count must be a multiple of 6.
 *   arc-easy, arc-challenge   AI2's ARC jsonl: {"question": {"stem", "choices": [{"text", "label"}]},
 *               "answerKey"}; 2..8 choices, labels A-E or 1-5 (any strings: the gold is the choice
 *               whose label equals answerKey).
 *   piqa        jsonl {"goal", "sol1", "sol2"} plus its labels file (one 0 / 1 per line, the
 *               manifest's piqa-labels); a line with its own "label" field needs no labels file.
 *   winogrande  llm-foundry's partial-scoring jsonl {"context_options": [2], "continuation", "gold"}, or
 *               the original schema {"sentence" with one "_", "option1", "option2", "answer": "1"|"2"}.
 *   lambada     jsonl {"context", "continuation"} (llm-foundry's lambada_openai), or {"text"} split at
 *               its last space as lm-eval's lambada_openai.yaml does.
 *
 * ---- Protocol lm-eval (lm-evaluation-harness 0.4.13) ---------------------------------------------------
 *   Requests (lm_eval/tasks/TASK/TASK.yaml, api/task.py ConfigurableTask.construct_requests; the
 *   target_delimiter is " "): every choice i is a pair (context, continuation):
 *     arc-*       ("Question: {stem}\nAnswer:", " {choice text}")            arc/arc_easy.yaml
 *     piqa        ("Question: {goal}\nAnswer:", " {sol}")                    piqa/piqa.yaml
 *     hellaswag   (preprocess(context line), " " + preprocess(ending))       hellaswag/utils.py
 *                 preprocess(t) = t.strip(), " [title]" -> ". ", every "[...]" (shortest) removed,
 *                 "  " -> " " (one left-to-right pass). lm-eval builds the context from the HF fields
 *                 as activity_label + ": " + ctx_a + " " + ctx_b.capitalize(); the 6-line file holds
 *                 ctx_b as written, so that one capital letter can differ from lm-eval on the HF set.
 *     winogrande  (sentence up to "_" with option i filled in, " " + the rest after "_" stripped)
 *                 winogrande/preprocess_winogrande.py (multiple_input: the choices are contexts)
 *     lambada     (the passage without its last word, " " + last word)    lambada/lambada_openai.yaml
 *   Tokens (api/model.py TemplateLM.loglikelihood / _encode_pair, models/huggingface.py tok_encode):
 *     trailing whitespace of the context moves to the front of the continuation; whole =
 *     tok(context + continuation), ctx = tok(context), both with the tokenizer's special tokens (BOS
 *     when the model adds BOS); cont = whole[len(ctx):]; the model reads ctx + cont (which is not
 *     whole when the boundary merges) and every cont token is scored:
 *     ll = Σ log p(cont[j] | ctx, cont[<j]), greedy = every cont[j] is the argmax.
 *   Metrics (api/task.py process_results, multiple_choice): acc = [argmax_i ll_i == gold];
 *     acc_norm = [argmax_i ll_i / len(choice_i) == gold] with len the choice's length in characters
 *     (Python len of the str: Unicode code points, without the delimiter) — lm-eval's "acc_norm";
 *     argmax takes the first maximum (numpy). winogrande reports acc only (its yaml). lambada:
 *     acc = greedy, perplexity = exp(-mean ll) (lambada_openai.yaml metric_list).
 *   Standard error (api/metrics.py mean_stderr): sqrt(Σ (x - mean)² / (n - 1)) / sqrt(n) over the
 *     per-item 0/1 values. lambada's perplexity: lm-eval bootstraps it; here ppl · stderr(ll) (delta
 *     method), named so in the report.
 *
 * ---- Protocol llamacpp (llama.cpp tools/perplexity/perplexity.cpp, vendored 0.3.36) ----------------------
 *   Strings: every choice is ONE text tokenized whole (common_tokenize(ctx, text, add_special = true),
 *   special-token texts not parsed):
 *     hellaswag   context + " " + ending, the file's lines as they are (hellaswag_score)
 *     winogrande  first + choice + second, the sentence split at "_" (winogrande_score); from the
 *                 llm-foundry form: context_options[i] + " " + continuation, no space when the
 *                 continuation starts with . , ; : ! ? (the original "_." sentences)
 *     arc-*, piqa  question + " " + answer (multiple_choice_score); llama.cpp reads these from a binary
 *                 file whose question text is the converter's choice: here lm-eval's prompt
 *                 "Question: {q}\nAnswer:" and the choice text, so that the two protocols differ in
 *                 the scoring only.
 *     lambada     llama.cpp has no LAMBADA mode: scored with the lm-eval rule under both protocols.
 *   Scores: common prefix P = the number of leading tokens equal in all choices' sequences; a choice's
 *     score is the MEAN of log p(tok[j] | tok[<j]) over j in [P, n) (hellaswag_score,
 *     multiple_choice_score: "acc_norm" in llama.cpp's printout); the choice with the largest score,
 *     first maximum on ties, is the prediction; acc = [prediction == gold].
 *   winogrande (winogrande_score): n_base_i = len(tok(first + choice_i)); when both sequences have more
 *     than 3 tokens after P the choice words are skipped (j from n_base_i), else j from P; the last
 *     token is excluded when more than one is scored; score = mean; choice 1 wins only when its score
 *     is strictly larger. Reproduced bug for bug: when the choice words are not skipped, llama.cpp
 *     scores choice 2's first token with the logits of choice 1's last position (its "FIXME").
 *   Log-probabilities are computed here in double (llama.cpp: float), so ties within float rounding can
 *   be broken differently.
 *   Selection (--limit N, no seed): the N items llama-perplexity picks, in its order, with
 *   std::mt19937(1): hellaswag (--hellaswag-tasks N) draws std::uniform_int_distribution(0, left - 1)
 *   (libstdc++ >= 11: Lemire's method on one 32-bit draw, _S_nd) and removes the item, keeping the
 *   order of the rest; winogrande (--winogrande-tasks) and arc / piqa (--multiple-choice-tasks) draw
 *   j = (int)(2^-32f · (float)rng() · (float)left) and swap the last item into j. llama-perplexity
 *   --hellaswag uses 400 tasks by default and shuffles even all of them; here no --limit = every item
 *   in file order.
 *
 * ---- Selection under lm-eval ---------------------------------------------------------------------------
 *   --limit N: the first N items (lm-eval's --limit); with a seed: N items drawn without replacement
 *   by a splitmix64 stream of the seed (Fisher-Yates), kept in file order. The same with llamacpp and a
 *   seed.
 *
 * ---- How the model is run --------------------------------------------------------------------------------
 *   Every choice of every item is one causal sequence: the tokens the protocol's rules above give it (lm-eval:
 *   ctx + cont, each tokenized on its own; llamacpp: the whole text tokenized once). Prefix reuse (the default)
 *   changes no token and no scored position, only how much is computed: a causal model's keys, values and
 *   hidden states of a prefix do not depend on what follows it, so the leading tokens that ALL choices of an
 *   item read alike run once, and each choice continues from their keys and values
 *   (calib/model/forward.h llmq_forward_block_prefixed). The shared prefix P of an item is the longest run of
 *   equal leading token ids over its choices' sequences, cut at the first scored position of any choice (and
 *   llama.cpp winogrande's probe position), leaving every choice one token of its own. Where it applies:
 *     lm-eval     every multiple-choice task where the choices share the context string (hellaswag, arc-*,
 *                 piqa): P = len(tok(context)) - 1, the context's tokens but its last, whose logits score the
 *                 first continuation token and so run with each choice (lm-eval tokenizes the context alone,
 *                 so the split at the boundary is exact whatever tok(ctx + cont) does there); winogrande (the
 *                 contexts differ, the continuation is shared): the tokens before the filled-in option;
 *     llamacpp    the common token prefix of the whole texts, less one (the prefix's last token scores the
 *                 first differing one): where the boundary merges into one token the split moves before it,
 *                 as in llama.cpp's own hellaswag_score / multiple_choice_score, which also evaluate the common
 *                 prefix once;
 *     never       lambada (one choice), and an item whose choices share no first token.
 *   The items of a task go in file order in groups (about 256 MiB of hidden states plus ONE layer's prefix K/V,
 *   at least max_batch_tokens tokens); within a group the prefixes and the continuations are each sorted by
 *   length (longest first) and packed into calls of up to max_batch_tokens tokens, padding at the END to the
 *   longest of the call (a call closes before its padding would exceed 1/8 of it), and the model runs layer
 *   by layer over all calls of the group. With --no-prefix-reuse (opts.no_prefix_reuse) every choice runs from
 *   position 0, all sequences of a task sorted by length and packed the same way call by call (the path before
 *   prefix reuse). Both give the same scores up to f32 rounding of other call shapes: within 1e-5 relative
 *   without emulation (tests/py/test_tasks_oracle.py test_prefix_reuse_same_scores; SmolLM2 and stories260K,
 *   max 1.4e-6); under --emulate the f16 K/V and int8 activation roundings turn that rounding into whole steps,
 *   ~2% of a mean log-prob on SmolLM2 Q4_1, the same as another batching of the old path gives. Tokens reported
 *   (item and task "tokens") are the tokens through the model: P once plus each choice's own. The output head
 *   runs only on the positions whose logits are scored.
 *
 * ---- Emulating llama-perplexity's batches (--emulate llamacpp-cpu with --protocol llamacpp) ---------------
 *   llama.cpp's flash attention (on by default on the CPU) runs a ubatch of fewer than GGML_FA_TILE_Q = 64
 *   queries on its vector path, which reads Q in f16 and accumulates V in f16 (ggml-cpu ops.cpp
 *   ggml_compute_forward_flash_attn_ext_f16_one_chunk); larger ubatches keep both in f32. Which ubatch a token
 *   lands in depends on how llama-perplexity packs the items (tools/perplexity/perplexity.cpp): items in order,
 *   each item's common prefix once and then each choice's own tokens, while the batch has at most max_seq
 *   sequences (one per choice; max_seq = min(128, -np), winogrande min(256, -np)) and -np * 512 tokens (-c 512,
 *   its default); the batch is cut into n_batch 2048 and then n_ubatch 512 pieces in order (one KV stream:
 *   kv_unified). The emulation replays that packing for the -np of opts.lc_parallel (--llamacpp-parallel;
 *   default 4, llama-perplexity's max(4, -np) with -np 1) and gives the rows of a small ubatch the vector
 *   path's arithmetic (calib/model/forward.h llmq_forward_set_favec_rows). Other -c / -b / -ub values are not
 *   modelled. Short items (arc-easy: two per batch at -np 8, often under 64 tokens) take it most.
 *
 * ---- Errors ----------------------------------------------------------------------------------------------
 *   LLMQ_ERR_ARG unknown task name / bad list, an item longer than the model's context limit
 *   (2^20 tokens); LLMQ_ERR_CORRUPT a malformed task file (file:line and what is wrong);
 *   LLMQ_ERR_NOT_FOUND / _IO the file or dataset; what calib/model/forward.h returns; LLMQ_ERR_NOMEM.
 */
#ifndef LLMQ_CALIB_EVAL_TASKS_H
#define LLMQ_CALIB_EVAL_TASKS_H

#include "calib/model/actq.h"
#include "common/status.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct llmq_model;

enum llmq_task_id {
    LLMQ_TASK_HELLASWAG = 0,
    LLMQ_TASK_ARC_EASY,
    LLMQ_TASK_ARC_CHALLENGE,
    LLMQ_TASK_PIQA,
    LLMQ_TASK_WINOGRANDE,
    LLMQ_TASK_LAMBADA,
    LLMQ_TASK_COUNT
};

enum llmq_task_protocol { LLMQ_TASK_PROTOCOL_LMEVAL = 0, LLMQ_TASK_PROTOCOL_LLAMACPP, LLMQ_TASK_PROTOCOL_COUNT };

#define LLMQ_TASK_MAX_CHOICES 8

const char *llmq_task_name(enum llmq_task_id id);                                  // "hellaswag", ...; "?"
bool llmq_task_from_name(const char *name, enum llmq_task_id *out);                // false if unknown
const char *llmq_task_protocol_name(enum llmq_task_protocol p);                    // "lm-eval", "llamacpp"
bool llmq_task_protocol_from_name(const char *name, enum llmq_task_protocol *out); // false if unknown
// Whether the task reports acc_norm under protocol p (lm-eval: arc-*, piqa, hellaswag).
bool llmq_task_has_norm(enum llmq_task_id id, enum llmq_task_protocol p);

// ---- items ---------------------------------------------------------------------------------------------

struct llmq_task_choice {
    char *ctx;        // malloc'd: the context (lm-eval) / the text before the split (llamacpp)
    char *cont;       // malloc'd: the continuation; ctx + cont is the whole text
    int64_t norm_len; // lm-eval acc_norm divisor: code points of the choice text (>= 1)
};

struct llmq_task_item {
    int64_t index; // 0-based position in the task file
    int n_choices; // C (1 for lambada)
    int gold;      // in [0, C)
    struct llmq_task_choice ch[LLMQ_TASK_MAX_CHOICES];
};

struct llmq_task_set {
    enum llmq_task_id id;
    enum llmq_task_protocol protocol;
    struct llmq_task_item *items; // (n_items), owned
    int64_t n_items;
    int64_t n_file_items; // items in the file (before selection)
    char *path;           // the file read (malloc'd)
    char sha256[65];      // of the task file's bytes (piqa: of the jsonl)
};

// Parses a task file's bytes into items with the strings of protocol p (rules above). labels: the
// piqa labels file's bytes (may be NULL otherwise, or when the jsonl carries "label"); what: the name
// used in error messages. On failure *out is zeroed.
enum llmq_status llmq_task_set_parse(enum llmq_task_id id, enum llmq_task_protocol p, const char *data, size_t len,
                                     const char *labels, size_t labels_len, const char *what,
                                     struct llmq_task_set *out);

// Loads a task: path NULL = the manifest dataset of the task's name (datasets/datasets.h; piqa also
// loads piqa-labels), else that file (".gz" read transparently; piqa: "FILE" or "FILE@LABELS").
enum llmq_status llmq_task_set_load(enum llmq_task_id id, enum llmq_task_protocol p, const char *path,
                                    struct llmq_task_set *out);
void llmq_task_set_free(struct llmq_task_set *s); // zeroed or NULL: no-op

// Keeps limit items (limit < 0 or >= n_items: all, in file order) chosen by the rules of "Selection".
void llmq_task_set_select(struct llmq_task_set *s, int64_t limit, bool use_seed, uint64_t seed);

// ---- results --------------------------------------------------------------------------------------------

struct llmq_task_item_result {
    int64_t index;                            // the item's position in the file
    int n_choices, gold;                      //
    int pred;                                 // argmax of score
    int pred_norm;                            // argmax of score_norm (-1 when the task has no acc_norm)
    double score[LLMQ_TASK_MAX_CHOICES];      // lm-eval: ll sum; llamacpp: the mean log-prob
    double score_norm[LLMQ_TASK_MAX_CHOICES]; // lm-eval: ll / norm_len; else 0
    bool greedy;                              // lambada: the continuation is the greedy one
    int64_t n_tokens;                         // tokens through the model for this item (a shared prefix once)
};

struct llmq_task_result {
    enum llmq_task_id id;
    enum llmq_task_protocol protocol;
    int64_t n_items, n_file_items;
    double acc, acc_stderr;           // fractions (x100 for %)
    bool has_norm;                    //
    double acc_norm, acc_norm_stderr; // when has_norm
    bool has_ppl;                     // lambada
    double ppl, ppl_stderr;           // exp(-mean ll), ppl · stderr(ll)
    int64_t tokens;                   // tokens through the model (padding excluded)
    double seconds;                   // wall time: tokenization, forward passes, scoring
    char *path;                       // the task file (malloc'd)
    char sha256[65];
    struct llmq_task_item_result *items; // (n_items) when opts.keep_items, else NULL; malloc'd
};

struct llmq_tasks_progress {
    enum llmq_task_id id;
    int64_t seq_done, n_seq;       // choice sequences evaluated / in the task
    int64_t tokens_done, n_tokens; // their tokens
    double elapsed_s;              // of this task
};

#define LLMQ_TASKS_LC_PARALLEL 4 // llama-perplexity's -np for the task modes: max(4, -np), -np 1 by default

struct llmq_tasks_opts {
    enum llmq_task_protocol protocol;
    int64_t limit; // < 0: all items
    bool use_seed; // --seed given
    uint64_t seed; //
    int n_threads; // >= 1
    enum llmq_backend backend;
    enum llmq_emulate emulate;
    int lc_parallel; // llamacpp-cpu, protocol llamacpp: llama-perplexity -np (raised to LLMQ_TASKS_LC_PARALLEL as it
                     // does)
    int64_t max_batch_tokens;           // tokens per forward call (<= 0: 2048)
    bool no_prefix_reuse;               // every choice from position 0 (header "How the model is run")
    bool keep_items;                    // fill llmq_task_result.items
    const char *paths[LLMQ_TASK_COUNT]; // per task a file instead of the manifest dataset (NULL: dataset)
    void (*progress)(void *user, const struct llmq_tasks_progress *p); // after every forward call; may be NULL
    void *progress_user;
};

struct llmq_tasks_report {
    int n_tasks;
    struct llmq_task_result *tasks; // (n_tasks) in the order asked
    double seconds;
};

// Parses "all" or a comma-separated list of task names, each optionally "NAME=PATH" (a file of that
// task's format). ids (LLMQ_TASK_COUNT) and paths (LLMQ_TASK_COUNT, indexed by task id; entries point
// into a copy owned by *buf, which the caller frees) are filled; *n the number of tasks, duplicates
// refused. LLMQ_ERR_ARG naming the bad entry.
enum llmq_status llmq_tasks_parse_list(const char *list, enum llmq_task_id *ids, int *n, const char **paths,
                                       char **buf);

// Evaluates m on the n_ids tasks ids under opts and fills *out (caller frees with
// llmq_tasks_report_free, also after a failure). Every item of every task goes through the model.
enum llmq_status llmq_tasks_run(const struct llmq_model *m, const enum llmq_task_id *ids, int n_ids,
                                const struct llmq_tasks_opts *opts, struct llmq_tasks_report *out);
void llmq_tasks_report_free(struct llmq_tasks_report *r); // zeroed: no-op

// lm-eval's mean_stderr of n values that are 0 or 1, k of them 1 (0 when n < 2).
double llmq_tasks_stderr01(int64_t k, int64_t n);

// llama.cpp's std::mt19937 (32-bit Mersenne twister), for the selection rules above.
struct llmq_mt19937 {
    uint32_t mt[624];
    int i;
};
void llmq_mt19937_seed(struct llmq_mt19937 *r, uint32_t seed);
uint32_t llmq_mt19937_next(struct llmq_mt19937 *r);

#endif // LLMQ_CALIB_EVAL_TASKS_H
